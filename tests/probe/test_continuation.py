"""A probe cut into legs (N steps, saved, then continued to M) is the same run as M steps straight."""

from __future__ import annotations

import math

import pytest
import torch

from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.continuation import Leg
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import PRESETS
from precsearch.probe.runner import run_probe

CPU = torch.device("cpu")
CFG = PRESETS["tiny"].with_overrides(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128)
# delayed scaling with a short history: its amax history lives outside the state_dict, so a
# continuation that forgot it would quantize step N with scale 1 and drift at once
DELAYED = Policy(default=Precision.FP8_DELAYED, warmup_steps=3, clip_grad=1.0,
                 recipe=LayerRecipe(amax_history_len=4))
POLICIES = {"bf16": Policy.bf16(1.0), "fp8_delayed": DELAYED}


def _probe(steps: int) -> ProbeSection:
    return ProbeSection(steps=steps, micro_batch=2, seq_len=32, lr=3e-3, lr_warmup_steps=2, device="cpu",
                        schedule="cosine")


def _run(steps: int, policy: Policy, leg: Leg | None = None):
    data = TokenBatches(synthetic_tokens(20_000, 256, 0), seq_len=32, micro_batch=2, seed=0, eval_batches=1)
    return run_probe(CFG, _probe(steps), policy, data, get_backend("emulated", CPU), CPU, leg=leg)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_two_legs_give_the_losses_of_one_straight_run(tmp_path, name):
    """6 steps saved, continued to 14, against 14 steps straight with the schedule over 14.

    A difference means some state was not carried (optimizer moments, LR schedule position,
    the delayed-scaling history, the data position) or the save perturbed the run.
    """
    policy = POLICIES[name]
    straight = _run(14, policy, Leg(horizon=14))
    ckpt = str(tmp_path / "leg1.pt")
    first = _run(6, policy, Leg(horizon=14, save_to=ckpt))
    second = _run(14, policy, Leg(horizon=14, resume_from=ckpt))
    assert second.start_step == 6 and first.start_step == 0
    assert len(second.losses) == 14 and second.losses[:6] == first.losses  # the history is carried on
    torch.testing.assert_close(torch.tensor(second.losses), torch.tensor(straight.losses), rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.tensor(second.grad_norms), torch.tensor(straight.grad_norms),
                               rtol=1e-5, atol=0)
    assert math.isclose(second.eval_loss, straight.eval_loss, rel_tol=1e-6)
    assert second.fp8_steps == straight.fp8_steps


def test_the_schedule_is_laid_over_the_horizon_not_the_leg(tmp_path):
    """A 6-step leg of a 14-step run is the prefix of that run, not a 6-step run with its own cosine."""
    short_own = _run(6, POLICIES["bf16"])
    prefix = _run(6, POLICIES["bf16"], Leg(horizon=14))
    straight = _run(14, POLICIES["bf16"], Leg(horizon=14))
    assert prefix.losses == straight.losses[:6]
    assert short_own.losses[:3] == prefix.losses[:3]  # same warm-up ...
    assert short_own.losses[5] != prefix.losses[5]  # ... then a faster-decaying LR


def test_a_diverged_leg_saves_nothing(tmp_path):
    """A leg that diverges leaves no checkpoint: there is nothing to continue."""
    ckpt = tmp_path / "leg.pt"
    wild = ProbeSection(steps=8, micro_batch=2, seq_len=32, lr=50.0, lr_warmup_steps=0, device="cpu",
                        divergence_factor=1.5)
    data = TokenBatches(synthetic_tokens(20_000, 256, 0), seq_len=32, micro_batch=2, seed=0, eval_batches=1)
    result = run_probe(CFG, wild, Policy.bf16(None), data, get_backend("emulated", CPU), CPU,
                       leg=Leg(horizon=16, save_to=str(ckpt)))
    assert result.diverged
    assert not ckpt.exists()


class _PickledMeta(torch.nn.Module):
    """Keeps its extra state as TE 2.20 keeps delayed-scaling metadata: a pickle in a byte tensor that
    ``set_extra_state`` refuses to unpickle unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2))
        self.meta = {"amax_history": [0.0]}

    def get_extra_state(self) -> torch.Tensor:
        import pickle
        return torch.frombuffer(bytearray(pickle.dumps(self.meta)), dtype=torch.uint8)

    def set_extra_state(self, state: torch.Tensor) -> None:
        import os
        import pickle
        if os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE") != "1":
            raise RuntimeError("Refusing to load pickled Transformer Engine extra state")
        self.meta = pickle.loads(state.numpy().tobytes())


def test_a_te_delayed_scaling_checkpoint_of_this_run_loads(tmp_path, monkeypatch):
    """TE's delayed-scaling metadata comes back (seen on the H200: every delayed-scaling rung after the
    first failed with TE's refusal), and the opt-in does not outlive the load."""
    from precsearch.probe import continuation
    from precsearch.probe.measure.events import StepMonitor
    from precsearch.probe.result import ProbeResult

    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)

    def build():
        model = _PickledMeta()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), StepMonitor(0.25, 10.0)

    model, opt, sched, monitor = build()
    model.meta = {"amax_history": [3.5, 2.0]}
    leg = Leg(horizon=4, save_to=str(tmp_path / "c.pt"))
    continuation.save(leg, model, opt, sched, monitor, ProbeResult(losses=[1.0, 0.9]))
    fresh, opt2, sched2, monitor2 = build()
    with pytest.raises(RuntimeError, match="Refusing"):  # what a plain load does
        fresh.load_state_dict(torch.load(leg.save_to, weights_only=True)["model"])
    step = continuation.restore(Leg(horizon=4, resume_from=leg.save_to), fresh, opt2, sched2, monitor2,
                                ProbeResult())
    assert step == 2 and fresh.meta == {"amax_history": [3.5, 2.0]}
    import os
    assert "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE" not in os.environ


def test_a_checkpoint_that_would_fill_the_disk_is_not_written(tmp_path, monkeypatch, capsys):
    """On the H200 the 8B-wide study's first-rung checkpoints (about 30 GB each) filled the disk and the
    study died in MLflow's sqlite ("database or disk is full"). Now the save is skipped and said."""
    import collections

    from precsearch.probe import continuation

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(continuation.shutil, "disk_usage", lambda path: usage(100 * 2**30, 98 * 2**30, 2 * 2**30))
    ckpt = tmp_path / "leg.pt"
    result = _run(6, DELAYED, Leg(horizon=14, save_to=str(ckpt)))
    assert not ckpt.exists() and not result.diverged
    assert "not written" in capsys.readouterr().err
    monkeypatch.setattr(continuation.shutil, "disk_usage", lambda path: usage(100 * 2**30, 50 * 2**30, 50 * 2**30))
    _run(6, DELAYED, Leg(horizon=14, save_to=str(ckpt)))
    assert ckpt.exists()
