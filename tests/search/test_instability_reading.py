"""How instability is read (``objectives.reading``), on constructed probe results with known values."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from precsearch.config.space import ObjectivesSection
from precsearch.probe.result import ProbeResult
from precsearch.search.scoring import measure_noise_floor, score, tail_gap, verdict

# BF16: falls from 4.0 for 12 steps, then flat at 2.0 for the last 4 (the tail window of 16 steps at 25%)
REFERENCE = [4.0 - 0.17 * i for i in range(12)] + [2.0] * 4
TAIL = ObjectivesSection(reading="tail", tail_fraction=0.25, stability_limit=0.01, spike_penalty=0.0)
FINAL = ObjectivesSection(reading="final", stability_limit=0.01, spike_penalty=0.0)


def _result(losses: list[float], eval_loss: float) -> ProbeResult:
    return ProbeResult(losses=list(losses), eval_loss=eval_loss, peak_memory_bytes=1000, target_memory_bytes=1000,
                       tokens_per_s=100.0)


def _policy(early_factor: float, tail_value: float, eval_loss: float) -> ProbeResult:
    return _result([x * early_factor for x in REFERENCE[:12]] + [tail_value] * 4, eval_loss)


def test_falling_faster_early_is_never_more_stable_than_bf16():
    """A 5% lead in the descent, level in the tail: instability 0 (as BF16's), not negative; the signed
    gaps are still reported. If it read below 0, a fast starter would outrank BF16 on instability."""
    fast = _policy(0.95, 2.0, eval_loss=1.90)
    ref = _result(REFERENCE, eval_loss=2.0)
    for objectives in (TAIL, FINAL):
        s = score(fast, ref, objectives)
        assert s.instability == 0.0 and s.feasible
    tail, final = score(fast, ref, TAIL), score(fast, ref, FINAL)
    assert tail.tail_gap == pytest.approx(0.0) and tail.instability_gap == pytest.approx(0.0)
    assert final.instability_gap == pytest.approx(-0.05) == final.loss_gap  # the final reading sees the lead


def test_the_tail_reading_sees_damage_that_an_early_lead_hides_in_the_final_loss():
    """Ahead by 10% early and 1% on the held-out set, but 2% behind BF16 over the last quarter of the run:
    the tail reading calls it unstable (gap +2% > limit 1%); the final reading calls it stable."""
    damaged = _policy(0.90, 2.04, eval_loss=1.98)
    ref = _result(REFERENCE, eval_loss=2.0)
    tail, final = score(damaged, ref, TAIL), score(damaged, ref, FINAL)
    assert tail.instability == pytest.approx(0.02) and not tail.feasible
    assert final.instability == 0.0 and final.feasible
    assert tail.loss_gap == pytest.approx(-0.01) == final.loss_gap  # the old field is the held-out gap in both
    assert tail.tail_gap == pytest.approx(0.02) == final.tail_gap  # reported whatever the reading


def test_the_tail_gap_is_paired_over_the_steps_both_ran():
    """The window is the last ceil(25%) of the steps both probes ran, a ratio of their means."""
    ref = _result([3.0, 2.0, 1.0, 1.0], 1.0)
    mine = _result([3.0, 2.0, 1.1, 1.3, 9.9], 1.0)  # a fifth step the reference never ran is not read
    assert tail_gap(mine, ref, 0.25) == pytest.approx(0.3)  # last 1 of 4 steps: 1.3 / 1.0 - 1
    assert tail_gap(mine, ref, 0.5) == pytest.approx(0.2)  # last 2: (1.1 + 1.3) / 2 - 1


def test_the_noise_floor_is_read_in_the_same_units_as_the_gap():
    """With the tail reading, the floor is the seeds' spread of their tail means (2.0, 2.02, 1.98 -> 1%)."""
    seeds = [_result(REFERENCE[:12] + [v] * 4, eval_loss=e) for v, e in ((2.0, 2.0), (2.02, 2.1), (1.98, 1.9))]
    assert measure_noise_floor(seeds, "tail", 0.25) == pytest.approx(0.01)
    assert measure_noise_floor(seeds, "final") == pytest.approx(0.05)
    s = score(_policy(1.0, 2.03, 2.0), seeds[0], TAIL, noise_floor=0.01)
    assert s.gap_in_noise == pytest.approx(1.5)


def test_a_reference_still_falling_in_the_window_is_flagged_as_early_descent():
    """A 16-step run still descending in its last quarter: the verdict says so (only a longer rung helps)."""
    falling = [4.0 - 0.1 * i for i in range(16)]
    s = score(_result(falling, 2.0), _result(falling, 2.0), TAIL)
    assert s.reference_tail_descent == pytest.approx((2.75 / 2.55) - 1)
    assert "still falling" in verdict(s)
    flat = score(_result(REFERENCE, 2.0), _result(REFERENCE, 2.0), TAIL)
    assert flat.reference_tail_descent == 0.0 and "still falling" not in verdict(flat)


def test_a_diverged_probe_scores_as_before_whatever_the_reading():
    diverged = ProbeResult(losses=[4.0, math.nan], diverged=True, peak_memory_bytes=1000, target_memory_bytes=1000)
    s = score(diverged, _result(REFERENCE, 2.0), TAIL)
    assert s.diverged and s.instability == 1.0 and not s.feasible


def test_unknown_reading_and_window_are_refused():
    with pytest.raises(ValidationError, match="reading"):
        ObjectivesSection(reading="early")
    with pytest.raises(ValidationError, match="tail_fraction"):
        ObjectivesSection(reading="tail", tail_fraction=0.0)


@pytest.mark.parametrize("value", [0.002, 0.05])
def test_the_damage_verdict_does_not_read_the_seed_noise_floor(value):
    """With ``reading: damage`` the verdict is the fixed-state reading, the loss gap's spikes and divergence
    against the paired seed: the extra BF16 seeds' spread (the noise floor) is reported and enters nothing
    else, which is why a damage space can run one reference seed (search_spaces/llama3_8b_h100.yaml)."""
    objectives = ObjectivesSection(reading="damage", damage={"limit": 0.01})
    ref = _result(REFERENCE, eval_loss=2.0)
    pol = _result(REFERENCE, eval_loss=2.02)
    pol.damage = {"value": value, "se": 0.0001}
    scores = [score(pol, ref, objectives, noise_floor=floor) for floor in (math.nan, 0.001, 0.03)]
    verdicts = {(s.stable, s.feasible, s.constraint, s.instability, s.loss_gap) for s in scores}
    assert len(verdicts) == 1
    assert scores[0].feasible is (value <= 0.01)
    assert math.isnan(scores[0].gap_in_noise) and scores[2].gap_in_noise == pytest.approx(0.01 / 0.03)
