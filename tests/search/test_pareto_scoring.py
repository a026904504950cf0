"""Pareto dominance, spike counting and scoring against the BF16 reference."""

import math

from precsearch.config.space import ObjectivesSection
from precsearch.probe.result import ProbeResult
from precsearch.search.pareto import dominates, pareto_indices
from precsearch.search.scoring import DIVERGED_INSTABILITY, constraint_value, count_spikes, score

DIRS = ["maximize", "minimize"]


def test_dominance_respects_directions():
    assert dominates([0.2, 0.01], [0.1, 0.02], DIRS)
    assert not dominates([0.2, 0.03], [0.1, 0.02], DIRS)  # better memory, worse stability: a trade-off
    assert not dominates([0.1, 0.02], [0.1, 0.02], DIRS)  # equal is not domination


def test_front_of_a_known_set():
    points = [[0.10, 0.000], [0.20, 0.005], [0.15, 0.010], [0.30, 0.020], [0.05, 0.000]]
    # [0.15, 0.010] is beaten by [0.20, 0.005]; [0.05, 0.0] by [0.10, 0.0]
    assert pareto_indices(points, DIRS) == [0, 1, 3]


def test_spikes_counted_above_running_mean():
    flat = [3.0, 2.9, 2.8, 2.7, 2.6, 2.5]
    assert count_spikes(flat, 0.25) == 0
    assert count_spikes(flat[:4] + [4.0] + flat[4:], 0.25) == 1


def _result(eval_loss, peak, losses=None, diverged=False, tps=100.0):
    return ProbeResult(losses=losses or [3.0, 2.5, 2.0], eval_loss=eval_loss, peak_memory_bytes=peak,
                       diverged=diverged, tokens_per_s=tps)


def test_score_against_reference():
    objectives = ObjectivesSection(stability_limit=0.01)
    ref = _result(2.0, 1000)
    s = score(_result(2.01, 900, tps=150.0), ref, objectives)
    assert math.isclose(s.memory_saved, 0.1)
    assert math.isclose(s.loss_gap, 0.005)
    assert s.feasible and math.isclose(s.speedup, 1.5)
    assert constraint_value(s, objectives) < 0
    worse = score(_result(2.1, 900), ref, objectives)
    assert not worse.feasible and constraint_value(worse, objectives) > 0


def test_better_than_reference_is_not_negative_instability():
    s = score(_result(1.9, 1000), _result(2.0, 1000), ObjectivesSection())
    assert s.loss_gap < 0 and s.instability == 0.0


def test_divergence_is_infeasible():
    s = score(_result(float("nan"), 900, diverged=True), _result(2.0, 1000), ObjectivesSection())
    assert s.diverged and not s.feasible and s.instability == DIVERGED_INSTABILITY
