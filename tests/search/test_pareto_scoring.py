"""Pareto dominance and scoring against the BF16 reference (noise floor and stress: test_noise_floor.py)."""

import math

import optuna
import pytest

from precsearch.config.space import ObjectivesSection
from precsearch.probe.result import ProbeResult
from precsearch.search.front import format_table, trial_rows
from precsearch.search.pareto import dominates, pareto_indices
from precsearch.search.scoring import DIVERGED_INSTABILITY, constraint_value, score

DIRS = ["maximize", "minimize"]


def test_dominance_respects_directions():
    assert dominates([0.2, 0.01], [0.1, 0.02], DIRS)
    assert not dominates([0.2, 0.03], [0.1, 0.02], DIRS)  # better memory, worse stability: a trade-off
    assert not dominates([0.1, 0.02], [0.1, 0.02], DIRS)  # equal is not domination


def test_front_of_a_known_set():
    points = [[0.10, 0.000], [0.20, 0.005], [0.15, 0.010], [0.30, 0.020], [0.05, 0.000]]
    # [0.15, 0.010] is beaten by [0.20, 0.005]; [0.05, 0.0] by [0.10, 0.0]
    assert pareto_indices(points, DIRS) == [0, 1, 3]


def test_instabilities_whose_intervals_overlap_count_as_equal():
    """Issue 53: the 8B study put 12 of 16 trials on its front, split by 2% differences in a reading whose standard
    error was larger. Within the intervals the trials tie on stability, and memory decides."""
    a, b = [0.30, 0.00100], [0.29, 0.00098]  # b reads 2% safer, a saves a point more
    assert not dominates(a, b, DIRS)  # exact values: a trade-off, both on the front
    assert dominates(a, b, DIRS, [0, 0.0002], [0, 0.0002])  # ± 2 SE overlap: a ties on stability, wins on memory
    assert not dominates(a, [0.29, 0.00050], DIRS, [0, 0.0002], [0, 0.0001])  # apart: a real trade-off
    assert dominates([0.3, 0.001], [0.2, 0.002], DIRS, [0, math.nan], [0, math.nan])  # NaN: no interval


def test_the_front_with_intervals_keeps_the_trade_off_among_equally_safe_trials_and_the_riskier_ones():
    points = [[0.30, 0.0010], [0.29, 0.0009], [0.25, 0.0011], [0.40, 0.0100], [0.10, 0.0001]]
    spreads = [[0, 0.0003], [0, 0.0003], [0, 0.0003], [0, 0.0010], [0, 0.00005]]
    # 0-2 overlap: 0 saves most of them; 3 is riskier beyond the intervals but saves more; 4 is safer beyond them
    assert pareto_indices(points, DIRS) == [0, 1, 3, 4]
    assert pareto_indices(points, DIRS, spreads) == [0, 3, 4]


def _event(step, kind):
    return {"step": step, "kind": kind, "value": 9.0, "baseline": 3.0}


def _result(eval_loss, peak, losses=None, diverged=False, tps=100.0, events=()):
    return ProbeResult(losses=losses or [3.0, 2.5, 2.0], eval_loss=eval_loss, peak_memory_bytes=peak,
                       target_memory_bytes=peak,
                       diverged=diverged, tokens_per_s=tps, events=list(events))


def test_spikes_and_blowups_beyond_the_references_are_penalised():
    """Only events the BF16 reference did not also have are the policy's fault; each costs spike_penalty."""
    objectives = ObjectivesSection(spike_penalty=0.002)
    ref = _result(2.0, 1000, events=[_event(5, "loss_spike")])
    mine = _result(2.0, 900, events=[_event(5, "loss_spike"), _event(9, "loss_spike"), _event(9, "grad_blowup"),
                                     _event(11, "grad_blowup")])
    s = score(mine, ref, objectives)
    assert (s.spikes, s.grad_blowups) == (1, 2)
    assert math.isclose(s.instability, 3 * 0.002)
    assert score(ref, mine, objectives).instability == 0.0  # fewer events than the reference is no credit


def test_score_against_reference():
    objectives = ObjectivesSection(stability_limit=0.01)
    ref = _result(2.0, 1000)
    s = score(_result(2.01, 900, tps=150.0), ref, objectives)
    assert math.isclose(s.memory_saved, 0.1)
    assert math.isclose(s.loss_gap, 0.005)
    assert s.feasible and math.isclose(s.speedup, 1.5)
    assert constraint_value(s) < 0 and s.stable
    worse = score(_result(2.1, 900), ref, objectives)
    assert not worse.feasible and constraint_value(worse) > 0


def test_better_than_reference_is_not_negative_instability():
    s = score(_result(1.9, 1000), _result(2.0, 1000), ObjectivesSection())
    assert s.loss_gap < 0 and s.instability == 0.0


def test_divergence_is_infeasible():
    s = score(_result(float("nan"), 900, diverged=True), _result(2.0, 1000), ObjectivesSection())
    assert s.diverged and not s.feasible and s.instability == DIVERGED_INSTABILITY
    assert constraint_value(s) > 0


def _damage_study(readings: list[tuple[float, float, float]]) -> optuna.Study:
    """An in-memory study of a damage-read space (limit 0.01) with one trial per (memory saved, reading, SE)."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("space", {"probe": {"steps": 40}, "objectives": {
        "reading": "damage", "damage": {"measure": "update_norm", "limit": 0.01}}})
    for k, (memory, reading, se) in enumerate(readings):
        score = {"memory_saved": memory, "instability": reading, "damage_se": se, "loss_gap": 0.0,
                 "tokens_per_s": 1.0, "feasible": True, "diverged": False, "reading": "damage",
                 "damage_measure": "update_norm"}
        study.add_trial(optuna.trial.create_trial(
            values=[memory, reading], params={"k": k},
            distributions={"k": optuna.distributions.IntDistribution(0, 99)}, user_attrs={"score": score}))
    return study


def test_the_front_counts_every_stable_trial_as_equally_safe_and_keeps_the_riskier_ones_that_buy_more():
    """Issue 53: the quickstart's front kept trial 4 (4.83% saved, reading 1.8e-5) beside trial 8 (5.22%, 1.9e-4)
    because its reading was smaller beyond the intervals, though both were at 2% of the limit or less."""
    rows = trial_rows(_damage_study([
        (0.0522, 0.000187, 0.000055),  # 0: stable, saves most of the stable ones
        (0.0483, 0.0000182, 0.000012),  # 1: stable, a smaller reading: no safer to act on
        (0.0700, 0.0095, 0.0002),  # 2: near the limit, saves more: the riskier choice, kept
        (0.0600, 0.0098, 0.0001),  # 3: near the limit, saves less than 2 at a reading its interval overlaps
        (0.0800, 0.0097, 0.0001),  # 4: near the limit, saves most: beats 2 and 3
    ]), ["memory_saved", "instability"])
    bands = [r["instability_band"] for r in rows]
    assert bands == ["stable", "stable", "near the limit", "near the limit", "near the limit"]
    assert [r["trial"] for r in rows if r["pareto"]] == [0, 4]
    # a stable trial is never dominated by a riskier one, however much more it saves
    rows = trial_rows(_damage_study([(0.01, 0.001, 0.0001), (0.5, 0.0095, 0.001)]), ["memory_saved", "instability"])
    assert [r["pareto"] for r in rows] == [True, True]


def _speed_study(trials: list[tuple[float, float, float]]) -> optuna.Study:
    """A memory-and-speed study: one trial per (memory saved, tokens/s, its standard error)."""
    study = optuna.create_study(directions=["maximize", "maximize"])
    study.set_user_attr("space", {"probe": {"steps": 40}, "objectives": {}})
    for k, (memory, rate, se) in enumerate(trials):
        score = {"memory_saved": memory, "instability": 0.0, "loss_gap": 0.0, "tokens_per_s": rate,
                 "tokens_per_s_se": se, "feasible": True, "diverged": False}
        study.add_trial(optuna.trial.create_trial(
            values=[memory, rate], params={"k": k},
            distributions={"k": optuna.distributions.IntDistribution(0, 99)}, user_attrs={"score": score}))
    return study


def test_speeds_within_each_others_intervals_are_one_speed_on_the_front():
    """Issue 53: a trial saving less memory stayed on the front for 0.3% more tokens/s, inside its steps' noise."""
    trials = [(0.40, 1000.0, 2.0),   # 0: saves the most
              (0.39, 1003.0, 2.0),   # 1: 3 tok/s faster, intervals (± 2 SE) overlap: no faster, and saves less
              (0.38, 1100.0, 2.0)]   # 2: faster beyond both intervals: a real trade-off
    rows = trial_rows(_speed_study(trials), ["memory_saved", "tokens_per_s"])
    assert [r["pareto"] for r in rows] == [True, False, True]
    assert "1000 ± 4" in format_table(rows)  # the table's tok/s with its ± 2 SE, as the front compares them
    untimed = [(m, rate, math.nan) for m, rate, _ in trials]  # no error (too few steps, stored before): as before
    assert [r["pareto"] for r in trial_rows(_speed_study(untimed), ["memory_saved", "tokens_per_s"])] == \
        [True, True, True]


def test_the_speedups_error_adds_both_runs_relative_errors():
    trial, reference = _result(2.0, 900, tps=200.0), _result(2.0, 1000, tps=100.0)
    trial.tokens_per_s_rel_se, reference.tokens_per_s_rel_se = 0.003, 0.004
    s = score(trial, reference, ObjectivesSection())
    assert s.speedup == 2.0 and s.speedup_se == pytest.approx(2.0 * 0.005)
    assert s.tokens_per_s_se == pytest.approx(0.6)
    reference.tokens_per_s_rel_se = math.nan  # a reference stored before the error was kept
    assert math.isnan(score(trial, reference, ObjectivesSection()).speedup_se)


def test_the_trial_lines_speed_up_carries_its_interval_where_both_runs_have_one():
    from precsearch.search.scoring import speed_text

    trial, reference = _result(2.0, 900, tps=200.0), _result(2.0, 1000, tps=100.0)
    assert speed_text(score(trial, reference, ObjectivesSection())) == "speed-up 2.00x"  # no errors stored
    trial.tokens_per_s_rel_se, reference.tokens_per_s_rel_se = 0.003, 0.004
    assert speed_text(score(trial, reference, ObjectivesSection())) == "speed-up 2.00x ± 0.02"  # 2 SE
    assert speed_text(score(trial, _result(2.0, 1000, tps=0.0), ObjectivesSection())) == "speed-up not measured"


def test_an_empty_front_says_how_many_trials_finished_and_where_to_look():
    """A study whose every trial read unstable printed a front header with 'instability in (unit not stored)'."""
    from precsearch.search.front import no_front_text

    text = no_front_text([{"trial": 0, "feasible": False}, {"trial": 1, "feasible": False}])
    assert "none of the 2 finished trial(s) is feasible" in text and "precsearch front --all" in text
    assert "no trial has finished" in no_front_text([])
    assert "unit not stored" not in text


def test_an_empty_front_names_the_least_unstable_trial_that_did_not_diverge():
    """finetune_smollm2_cpu.yaml: all 8 trials read unstable or near the limit; the user's next look is the
    nearest to feasible: the best band first, then the smallest reading (a diverged trial is none, whatever its
    reading)."""
    from precsearch.search.front import no_front_text

    def row(trial, instability, band, diverged=False):
        return {"trial": trial, "feasible": False, "instability": instability, "instability_band": band,
                "instability_figure": f"{instability:g} ± 0.001 (2 SE)", "memory_saved": 0.0071,
                "diverged": diverged}

    text = no_front_text([row(0, 0.044, "unstable"), row(6, 0.0081, "near the limit"), row(4, 0.0078, "unstable"),
                          row(2, 0.0001, "stable", diverged=True), row(5, 0.0102, "unstable")])
    assert "the least unstable is trial 6 (0.0081 ± 0.001 (2 SE), near the limit; memory saved 0.71%)" in text, text
    assert "none of the 5 finished trial(s) is feasible" in text  # trial 4 reads less, but in a worse band


def test_front_trials_no_interval_separates_are_one_point_on_the_front():
    """Issue 53: the Megatron target's 8B study (H100, 2026-12-07) put trials 7 and 8 on the front, the same
    policy but for the amax history (1024, 16) that its fixed-state reading does not see: the same memory saved,
    the same reading, speeds within each other's intervals. One stands for both (the smallest reading, then the
    earliest trial); the other names it."""
    trials = [(0.30, 1000.0, 20.0),   # 0: on the front
              (0.30, 1020.0, 10.0),   # 1: the same memory, a speed within 0's interval: as good as 0
              (0.28, 1200.0, 10.0),   # 2: a real trade-off
              (0.30, 900.0, 10.0)]    # 3: dominated by 0 (slower beyond the intervals): not a twin
    rows = trial_rows(_speed_study(trials), ["memory_saved", "tokens_per_s"])
    assert [r["pareto"] for r in rows] == [True, False, True, False]
    assert rows[1]["front_twin"] == 0 and all("front_twin" not in r for r in (rows[0], rows[2], rows[3]))
    table = format_table(rows, flags=True)
    assert "= 0" in next(line for line in table.splitlines() if line.split()[:1] == ["1"])
    assert "pareto '= N'" in table
    # among equals, the smallest reading stands for them: the quickstart's trial 6 (3.8x the standard recipe)
    # rather than trial 2 (19x), both stable and saving 5.22%
    rows = trial_rows(_damage_study([(0.0522, 0.000705, 0.0002), (0.0522, 0.000138, 0.00002)]),
                      ["memory_saved", "instability"])
    assert [r["pareto"] for r in rows] == [False, True] and rows[0]["front_twin"] == 1
    # equal within intervals needs every objective: a faster twin beyond the intervals is its own point
    apart = trial_rows(_speed_study([(0.30, 1000.0, 2.0), (0.30, 1100.0, 2.0)]), ["memory_saved", "tokens_per_s"])
    assert [r["pareto"] for r in apart] == [False, True] and all("front_twin" not in r for r in apart)


def test_equal_points_need_every_objective_within_the_intervals():
    from precsearch.search.pareto import distinct, equal

    assert equal([0.3, 10.0], [0.3, 11.0], [0.0, 1.0], [0.0, 0.5])
    assert not equal([0.3, 10.0], [0.31, 10.0], [0.0, 1.0], [0.0, 1.0])  # memory is exact
    assert not equal([0.3, 10.0], [0.3, 13.0], [0.0, 1.0], [0.0, 1.0])
    points = [[0.3, 10.0], [0.3, 10.5], [0.3, 12.4]]
    spreads = [[0.0, 1.0]] * 3
    # 1 equals 0; 2 is within 1's interval but not 0's: compared with the kept ones only, it is kept
    assert distinct([0, 1, 2], points, spreads) == {0: None, 1: 0, 2: None}
