"""The speed-up a study's framework target runs a trial at (issue 52): Megatron's predicted from the probe's
steps with Megatron's optimizer step swapped in, scored as the trial's speed-up, the probe's kept beside it."""

from __future__ import annotations

import math

from precsearch.config.loader import load_space
from precsearch.policy import Policy
from precsearch.policy.rules import MemoryKnobs
from precsearch.probe.result import ProbeResult
from precsearch.runtime.target_speed import NOT_SWAPPED, study_target_speed
from precsearch.search.front import format_table
from precsearch.search.scoring import Score, score, speed_text

H100 = "NVIDIA H100 80GB HBM3"
TOKENS = 4096  # the Megatron space's seq_len x micro_batch


def _space(target: str | None = "megatron") -> dict:
    data = load_space("search_spaces/llama3_8b_h100_megatron.yaml").model_dump(mode="json")
    data["target"] = {"name": target} if target else None
    return data


def _policy(clip: float | None = 1.0) -> Policy:
    memory = MemoryKnobs(master_weights=True, master_dtype="remainders", moment_dtype="bf16")
    return Policy(clip_grad=clip, memory=memory)


def _probe(step_s: float, optimizer_s: float, card: str = H100) -> ProbeResult:
    return ProbeResult(tokens_per_s=TOKENS / step_s, optimizer_step_s=optimizer_s, card=card,
                       losses=[3.0, 2.9], eval_loss=2.9, peak_memory_bytes=2**30, target_memory_bytes=2**31)


def test_a_megatron_study_predicts_megatrons_speed_up_from_the_probes_steps():
    trial, reference = _probe(0.1027, 0.02295), _probe(0.1018, 0.02175)
    got = study_target_speed(_space(), _policy(), trial, reference)
    assert got.why_not == "" and 1.08 < got.speedup < 1.13  # Megatron measured 1.10x; the probe says 0.99x
    assert trial.tokens_per_s / reference.tokens_per_s < 1.0


def test_where_nothing_is_measured_the_probes_speed_up_stands_and_says_why():
    on_cpu = study_target_speed(_space(), _policy(), _probe(0.1, 0.02, card=""), _probe(0.1, 0.02, card=""))
    assert math.isnan(on_cpu.speedup) and "not measured on this device" in on_cpu.why_not
    unclipped = study_target_speed(_space(), _policy(clip=None), _probe(0.1, 0.02), _probe(0.1, 0.02))
    assert math.isnan(unclipped.speedup) and "without clipping" in unclipped.why_not
    for target, backend in (("accelerate", "te"), ("torchtitan", "torchao")):
        got = study_target_speed(_space(target) | {"backend": backend}, _policy(), _probe(0.1, 0.02),
                                 _probe(0.1, 0.02))
        assert math.isnan(got.speedup) and got.why_not == NOT_SWAPPED[target]
    mixed = study_target_speed(_space(), _policy(), _probe(0.1, 0.02), _probe(0.1, 0.02, card=""))
    assert math.isnan(mixed.speedup) and f"the trial ran on {H100}, its BF16 reference on a CPU or" in mixed.why_not
    assert study_target_speed(_space(None), _policy(), _probe(0.1, 0.02), _probe(0.1, 0.02)) is None
    assert study_target_speed(_space("precsearch"), _policy(), _probe(0.1, 0.02), _probe(0.1, 0.02)) is None


def test_a_torchtitan_study_says_where_its_probe_did_not_run_as_torchtitan():
    """torchtitan's speed is the probe's only where the probe ran torchao's FP8 Linear in compiled blocks: backend
    torchao on a GPU. Elsewhere the front says what ran instead."""
    for backend, card, ran in (("te", H100, "the probe ran backend te,"),
                               ("torchao", "", "the probe ran backend torchao on a CPU,")):
        got = study_target_speed(_space("torchtitan") | {"backend": backend}, _policy(), _probe(0.1, 0.02, card),
                                 _probe(0.1, 0.02, card))
        assert math.isnan(got.speedup) and got.why_not.startswith(ran) and "no prediction" in got.why_not


def _score(trial: ProbeResult, reference: ProbeResult, space: dict) -> Score:
    from precsearch.config.space import ObjectivesSection

    # the loss reading: these probes carry no damage reading
    objectives = ObjectivesSection(**{k: v for k, v in space["objectives"].items() if k not in ("damage", "reading")},
                                   reading="tail")
    speed = study_target_speed(space, _policy(), trial, reference)
    return score(trial, reference, objectives, framework=("megatron", 0.3), framework_speed=speed)


def test_the_score_carries_the_targets_speed_up_and_the_probes_beside_it():
    trial, reference = _probe(0.1027, 0.02295), _probe(0.1018, 0.02175)
    s = _score(trial, reference, _space())
    assert s.speedup == s.speedup_framework and 1.08 < s.speedup < 1.13
    assert math.isclose(s.speedup_probe, trial.tokens_per_s / reference.tokens_per_s) and s.speedup_note == ""
    assert speed_text(s).startswith(f"speed-up {s.speedup:.2f}x") and \
        f"in megatron, predicted (the probe: {s.speedup_probe:.2f}x)" in speed_text(s)
    on_cpu = _score(_probe(0.1027, 0.02295, ""), _probe(0.1018, 0.02175, ""), _space())
    assert on_cpu.speedup == on_cpu.speedup_probe and math.isnan(on_cpu.speedup_framework)
    assert "not measured on this device" in on_cpu.speedup_note and "predicted" not in speed_text(on_cpu)
    assert speed_text(on_cpu).endswith("x (the probe's)")
    assert Score.from_dict({k: v for k, v in s.to_dict().items()
                            if not k.startswith("speedup_")}).speedup_probe != s.speedup_probe  # stored before: NaN


def test_the_front_row_shows_the_probes_speed_up_beside_the_targets():
    row = {"trial": 3, "memory_saved": 0.3, "instability": 0.001, "loss_gap": 0.0, "diverged": False,
           "noise_floor": math.nan, "gap_in_noise": math.nan, "tokens_per_s": 40000.0, "fidelity_steps": 40,
           "policy": "mlp=fp8_current", "memory_framework": "megatron", "memory_saved_own": 0.24,
           "speedup": 1.18, "speedup_framework": 1.18, "speedup_probe": 1.06}
    table = format_table([row])
    assert "[precsearch itself: memory saved 24.00%, speed-up 1.06x; in megatron: speed-up 1.18x, predicted]" \
        in table
    assert "speed-up: the probe's" not in table
    why = "megatron's optimizer step for the trial (...) is not measured on NVIDIA H200"
    plain = format_table([{**row, "speedup_framework": math.nan, "speedup": 1.06, "speedup_note": why}] * 2)
    assert "[precsearch itself: memory saved 24.00%]" in plain
    assert plain.count(f"speed-up: the probe's, since {why}") == 1  # once, under the table


def test_front_csv_carries_the_targets_speed_up_beside_the_probes_where_the_study_predicted_one(tmp_path):
    import csv

    from precsearch.tracking.front_report import write_front

    row = {"trial": 3, "fidelity_steps": 40, "pareto": True, "feasible": True, "memory_saved": 0.3,
           "instability": 0.001, "loss_gap": 0.0, "diverged": False, "noise_floor": math.nan,
           "gap_in_noise": math.nan, "policy": "mlp=fp8_current", "tokens_per_s": 40000.0, "tokens_per_s_se": 100.0,
           "speedup": 1.18, "speedup_framework": 1.18, "speedup_probe": 1.06}
    write_front([row], tmp_path / "a", 0.002, throughput=True)
    with (tmp_path / "a" / "front.csv").open() as fh:
        (written,) = list(csv.DictReader(fh))
    assert (written["speedup_framework"], written["speedup_probe"]) == ("1.18", "1.06")
    write_front([{**row, "speedup_framework": math.nan}], tmp_path / "b", 0.002, throughput=True)
    assert "speedup_framework" not in (tmp_path / "b" / "front.csv").read_text()
