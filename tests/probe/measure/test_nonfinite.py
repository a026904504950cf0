"""Non-finite values anywhere in a probe or a fixed-state reading (:mod:`precsearch.probe.measure.nonfinite`).

Faults are injected as in ``test_diagnostics.py``: a backend that adds a hook at convert (a gradient) or to the
optimizer it builds (a state or a weight, right after one optimizer step), so the step and the tensor that must
be named are known exactly. The weight fault is put in an embedding row of a token the data never holds: the
loss never reads it, so a probe that checked only the loss would call that run healthy.
"""

from __future__ import annotations

import math

import optuna
import pytest
import torch
from torch import nn

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import DamageSection, ObjectivesSection, ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe import runner
from precsearch.probe.damage import DamageReader
from precsearch.probe.damage.reading import Side, first_nonfinite
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.measure.nonfinite import NonFiniteWatch, is_nonfinite
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import Parallel, run_probe
from precsearch.search.front import format_table, trial_rows
from precsearch.search.scoring import score, verdict
from precsearch.tracking.trial_record import SearchReading, trial_tags

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
CPU = torch.device("cpu")
TARGET = "decoder.layers.1.mlp.linear_fc1.weight"
EMBEDDING = "embedding.word_embeddings.weight"
STEPS = 6
FINAL = ObjectivesSection(reading="final", stability_limit=0.01, spike_penalty=0.0, memory_basis="probe")


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(load_tokens("stdlib", max_tokens=100_000, vocab_size=256, seed=0),
                        seq_len=32, micro_batch=4, seed=0, eval_batches=1)


def probe() -> ProbeSection:
    return ProbeSection(steps=STEPS, micro_batch=4, seq_len=32, lr=3e-3, device="cpu", schedule="constant",
                        lr_warmup_steps=0)


def _unused_token(data: TokenBatches) -> int:
    """A token id no training or held-out batch of the probe holds."""
    seen = set()
    for step in range(STEPS):
        seen |= set(torch.cat(data.train_batch(step)).unique().tolist())
    for inputs, targets in data.eval_set():
        seen |= set(torch.cat([inputs, targets]).unique().tolist())
    return min(set(range(CFG.vocab_size)) - seen)


class FaultyBackend(EmulatedBackend):
    """The emulated backend, plus a NaN (or inf) put at step ``step`` into ``where``: ``grad`` (TARGET's
    gradient, by a hook), ``exp_avg_sq`` (TARGET's AdamW state) or ``weight`` (EMBEDDING's row ``row``), the last
    two right after that step's optimizer step."""

    def __init__(self, where: str, step: int, row: int = 0):
        self.where, self.step, self.row = where, step, row

    def convert(self, model, recipes):
        model = super().convert(model, recipes)
        if self.where == "grad":
            calls = [0]

            def poison(grad: torch.Tensor) -> torch.Tensor | None:
                calls[0] += 1  # one backward a step (no gradient accumulation)
                if calls[0] != self.step + 1:
                    return None
                grad = grad.clone()
                grad.view(-1)[7] = math.nan
                return grad

            model.get_parameter(TARGET).register_hook(poison)
        return model

    def build_optimizer(self, model, knobs, **kwargs):
        opt = super().build_optimizer(model, knobs, **kwargs)
        steps = [0]

        def poison(optimizer, _args, _kwargs) -> None:
            if steps[0] == self.step and self.where == "exp_avg_sq":
                optimizer.state[model.get_parameter(TARGET)]["exp_avg_sq"].view(-1)[7] = math.nan
            elif steps[0] == self.step and self.where == "weight":
                model.get_parameter(EMBEDDING).data[self.row, 5] = math.inf
            steps[0] += 1

        opt.register_step_post_hook(poison)
        return opt


@pytest.fixture(scope="module")
def reference(data) -> ProbeResult:
    """The BF16 probe every faulty one is scored against."""
    return run_probe(CFG, probe(), Policy.bf16(None), data, EmulatedBackend(), CPU)


@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip-1"])
def test_a_nan_gradient_is_named_with_its_step_and_the_trial_is_infeasible(data, clip, reference):
    """A NaN in one element of one gradient at step 3: the probe stops there naming that gradient (with a clip,
    too: scaled by a NaN norm every gradient would be NaN, and the first parameter would be named instead)."""
    result = run_probe(CFG, probe(), Policy.bf16(clip), data, FaultyBackend("grad", 3), CPU)
    assert result.nonfinite == {"step": 3, "tensor": f"{TARGET} grad", "state": None}
    assert result.diverged and result.diverged_step == 3 and len(result.losses) == 4
    assert result.reason.startswith(f"non-finite at step 3 in {TARGET} grad")
    s = score(result, reference, FINAL)
    assert not s.feasible and s.diverged and s.constraint > 0
    assert verdict(s) == f"diverged; non-finite at step 3 in {TARGET} grad"


def test_a_nan_optimizer_state_is_named_before_the_weight_it_makes(data, reference):
    """A NaN in TARGET's ``exp_avg_sq`` after step 2: found at step 2 by the state check, before it reaches the
    weight (next step) or the loss (the step after): the state, not the weight, is the cause."""
    result = run_probe(CFG, probe(), Policy.bf16(None), data, FaultyBackend("exp_avg_sq", 2), CPU)
    assert result.nonfinite == {"step": 2, "tensor": f"{TARGET} exp_avg_sq", "state": None}
    assert result.diverged_step == 2 and all(math.isfinite(x) for x in result.losses)
    s = score(result, reference, FINAL)
    assert not s.feasible and s.nonfinite == f"non-finite at step 2 in {TARGET} exp_avg_sq"


def test_an_inf_weight_the_loss_never_reads_is_found(data, reference):
    """An inf in the embedding row of a token no batch holds, after step 1: every loss stays finite (a loss
    check alone would miss it, as it missed issue 54's NaN embedding rows), and the weight check names it."""
    row = _unused_token(data)
    result = run_probe(CFG, probe(), Policy.bf16(None), data, FaultyBackend("weight", 1, row), CPU)
    assert result.nonfinite == {"step": 1, "tensor": EMBEDDING, "state": None}
    assert result.diverged_step == 1 and all(math.isfinite(x) for x in result.losses)
    s = score(result, reference, FINAL)
    assert not s.feasible and f"non-finite at step 1 in {EMBEDDING}" in verdict(s)


class _Off:
    """No check: what the probe did before it read states and weights."""

    def __init__(self, *_args):
        self.found = None

    def after_update(self, step: int) -> None:
        pass

    def gradients(self) -> None:
        pass

    def stopped(self, step: int, loss_finite: bool) -> None:
        pass


def test_a_healthy_probe_reports_nothing_and_the_check_changes_no_loss(data, monkeypatch, reference):
    """A probe with FP8 and gradient clipping that bites: nothing found, and its losses, gradient norms and
    held-out loss bit for bit those of the loop without the check and with ``clip_grad_norm_`` (if the check
    or the clip that spares non-finite gradients changed any number, they would differ)."""
    policy = Policy(rules=(Rule("all", ("*",), Precision.FP8_DELAYED),), clip_grad=0.5)
    checked = run_probe(CFG, probe(), policy, data, EmulatedBackend(), CPU)
    assert checked.nonfinite is None and not checked.diverged and checked.reason == ""
    assert any(g > 0.5 for g in checked.grad_norms)  # the clip scaled some steps' gradients
    monkeypatch.setattr(runner, "NonFiniteWatch", _Off)
    torch_clip = Parallel(clip=lambda model, max_norm: nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    plain = run_probe(CFG, probe(), policy, data, EmulatedBackend(), CPU, parallel=torch_clip)
    assert checked.losses == plain.losses and checked.grad_norms == plain.grad_norms
    assert checked.eval_loss == plain.eval_loss
    s = score(checked, reference, FINAL)
    assert s.nonfinite == "" and "non-finite" not in verdict(s)


def test_fp8_moments_and_their_scales_are_read():
    """An FP8 moment holds NaN as a bit pattern no float kernel reads (E4M3FN: S.1111.111), its ``scale_inv`` is
    FP32: each is named by its state key; integer states (remainder bits) are never non-finite."""
    x = torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn)
    assert not is_nonfinite(x) and not is_nonfinite(torch.tensor([32767, -1], dtype=torch.int16))
    x.view(torch.uint8)[1] = 0x7F
    assert is_nonfinite(x)
    assert is_nonfinite(torch.tensor([1.0, math.inf]).to(torch.float8_e5m2))
    layer = nn.Linear(4, 4)
    opt = torch.optim.AdamW(layer.parameters())
    weight = layer.weight
    opt.state[weight] = {"exp_avg": x, "exp_avg_scale_inv": torch.ones(1)}
    watch = NonFiniteWatch(layer, opt)
    watch.after_update(7)
    assert watch.found is not None and watch.found.describe() == "non-finite at step 7 in weight exp_avg"
    opt.state[weight] = {"exp_avg": torch.zeros(4, 4).to(torch.float8_e4m3fn),
                         "exp_avg_scale_inv": torch.tensor([math.nan])}
    watch.after_update(8)
    assert watch.found.describe() == "non-finite at step 8 in weight exp_avg_scale_inv"


def test_the_front_table_and_the_mlflow_tag_name_it(data, reference):
    """``precsearch front --all`` ends the trial's row with the finding, and the run's ``nonfinite`` tag holds it
    (``-`` for a trial without one): a reader of either must not need ``probe_result.json`` to see why."""
    result = run_probe(CFG, probe(), Policy.bf16(None), data, FaultyBackend("exp_avg_sq", 2), CPU)
    s = score(result, reference, FINAL)
    study = optuna.create_study(directions=["maximize", "minimize"])
    trial = study.ask()
    trial.suggest_categorical("precision.mlp", ["bf16", "fp8_current"])
    trial.set_user_attr("score", s.to_dict())
    study.tell(trial, [s.memory_saved, s.instability])
    table = format_table(trial_rows(study, ["memory_saved", "instability"]), flags=True)
    assert table.splitlines()[-1].endswith(f"[non-finite at step 2 in {TARGET} exp_avg_sq]"), table
    frozen = study.trials[0]
    tags = trial_tags(result, frozen, SearchReading(s, verdict(s), {}, {}, "relative", STEPS, "-"))
    assert tags["nonfinite"] == f"non-finite at step 2 in {TARGET} exp_avg_sq" and tags["feasible"] == "false"
    healthy = score(reference, reference, FINAL)
    assert trial_tags(reference, frozen, SearchReading(healthy, "", {}, {}, "relative", STEPS, "-")
                      )["nonfinite"] == "-"


def test_a_non_finite_stress_probe_is_named_under_stress():
    """A stress probe (``objectives.stress``) that goes non-finite is reported as stress is, named in the verdict;
    with ``stress.in_constraint`` off (the default) it does not decide feasibility."""
    ok = ProbeResult(losses=[2.0] * 4, eval_loss=2.0, peak_memory_bytes=1000, target_memory_bytes=1000,
                     tokens_per_s=1.0)
    bad = ProbeResult(losses=[2.0, math.nan], diverged=True, diverged_step=1, peak_memory_bytes=1000,
                      target_memory_bytes=1000, nonfinite={"step": 1, "tensor": "loss", "state": None})
    s = score(ok, ok, FINAL, stress=(bad, ok))
    assert s.feasible and s.nonfinite == "" and s.stress_diverged
    assert verdict(s).endswith("; under stress: diverged (non-finite at step 1 in loss)")


# --- the fixed-state reading -------------------------------------------------------------


class _PolicyFaultBackend(EmulatedBackend):
    """The emulated backend; a policy's model (one with an FP8 unit) built for the second state gets a NaN in
    TARGET's gradient on every backward. The BF16 side, built by the same backend, stays clean."""

    def __init__(self):
        self.policy_builds = 0

    def convert(self, model, recipes):
        model = super().convert(model, recipes)
        if any(r.precision is not Precision.BF16 for r in recipes.values()):
            self.policy_builds += 1
            if self.policy_builds == 2:
                model.get_parameter(TARGET).register_hook(lambda g: torch.full_like(g, math.nan))
        return model


def test_a_nan_gradient_at_a_state_of_the_reading_names_the_state_and_makes_the_trial_infeasible(data, reference):
    """The policy's gradient of TARGET is NaN at the second state (index 1, step 6): the reading names that state
    and the unit's gradient, and the trial is infeasible whatever its reading's value."""
    settings = DamageSection(states=[0.0, 1.0], batches=3, tokens_per_step=4096)
    policy = Policy(rules=(Rule("all", ("*",), Precision.FP8_CURRENT),))
    reader = DamageReader(CFG, probe(), data, _PolicyFaultBackend(), CPU, settings)
    reading = reader.read(policy)
    assert reading["nonfinite"] == {"step": STEPS, "tensor": f"{TARGET} gradient", "state": 1}
    result = run_probe(CFG, probe(), policy, data, EmulatedBackend(), CPU)
    result.damage = reading
    damage = ObjectivesSection(reading="damage", memory_basis="probe")
    s = score(result, reference, damage)
    assert not s.feasible and not s.diverged
    assert verdict(s) == f"infeasible; non-finite at state 1 (step {STEPS}) in {TARGET} gradient"


def test_a_non_finite_update_with_finite_gradients_is_named_as_the_update():
    """The compare's Gram matrices: ``e`` (gradient errors) finite, ``ue`` (update errors) not: the update."""
    finite = torch.eye(2, dtype=torch.float64)
    grams = {"a": {"e": finite, "ue": finite}, "b": {"e": finite, "ue": torch.full((2, 2), math.nan)}}
    assert first_nonfinite(grams, Side(grads=[], eval_losses=[2.0])) == "b.weight update"
    assert first_nonfinite({"a": grams["a"]}, Side(grads=[], eval_losses=[math.inf])) == "held-out loss"
    assert first_nonfinite({"a": grams["a"]}, Side(grads=[], eval_losses=[2.0])) is None


def test_the_check_runs_after_the_probes_clock_stops(data, monkeypatch):
    """The probe's tokens/s is the training's: the check, which a framework's run does not pay, is outside each
    step's time (on an H100 at the 8B width it cost 12% of a BF16 step and 22% of an FP8 one, and took the speed-up
    from 1.18x to 1.04x)."""
    from precsearch.probe import runner
    from precsearch.probe.measure.nonfinite import NonFiniteWatch

    events: list[tuple[str, int]] = []
    timed, checked = runner._time_step, NonFiniteWatch.after_update
    monkeypatch.setattr(runner, "_time_step", lambda run, step, *a: events.append(("clock", step)) or
                        timed(run, step, *a))
    monkeypatch.setattr(NonFiniteWatch, "after_update", lambda self, step: events.append(("check", step)) or
                        checked(self, step))
    result = run_probe(CFG, probe(), Policy.bf16(None), data, EmulatedBackend(), CPU)
    steps = len(result.losses)
    assert events == [(kind, s) for s in range(steps) for kind in ("clock", "check")]
