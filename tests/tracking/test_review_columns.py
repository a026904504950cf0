"""What a trial's row and point show in MLflow: objectives in the terminal's units, the sort key, name and colour.

What would be wrong if these failed: the runs table would show raw fractions cut to ``0.05030341…``, an
unstable trial would sort among the feasible ones, or two trials would share a colour in the charts.
"""

from __future__ import annotations

import math

from precsearch.tracking.review_columns import review_metrics, run_colour, run_name, trial_look


def test_objectives_in_percent_and_seed_spreads_as_the_terminal_prints_them():
    metrics = {"memory_saved": 0.0503034101, "instability": 0.0105512, "feasible": 1.0, "noise_floor": 0.0162}
    relative = review_metrics(metrics, "relative")
    assert relative["memory_saved_pct"] == 5.03 and relative["instability_pct"] == 1.055
    noise = review_metrics(metrics, "noise")
    assert noise["instability_spreads"] == 0.65 and "instability_pct" not in noise  # 0.01055 / 0.0162
    assert "instability_spreads" not in review_metrics(metrics | {"noise_floor": math.nan}, "noise")
    shown = review_metrics(metrics | {"tokens_per_s": 7423.652281, "gap_in_noise": 0.6512}, "noise")
    assert (shown["tokens_per_s"], shown["gap_in_noise"]) == (7424, 0.65)  # were cut to "7423.65228…"


def test_the_sort_key_puts_every_feasible_trial_before_any_unstable_one():
    feasible = review_metrics({"memory_saved": 0.01, "instability": 0.0, "feasible": 1.0}, "relative")
    unstable = review_metrics({"memory_saved": 0.60, "instability": 0.5, "feasible": 0.0}, "relative")
    assert feasible["feasible_first_memory_saved"] > unstable["feasible_first_memory_saved"]
    more = review_metrics({"memory_saved": 0.02, "instability": 0.0, "feasible": 1.0}, "relative")
    assert more["feasible_first_memory_saved"] > feasible["feasible_first_memory_saved"]


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def test_front_trials_are_named_and_saturated_and_no_two_trials_of_twenty_look_alike():
    assert run_name(5, True) == "trial-5 (front)" and run_name(5, False) == "trial-5"
    assert trial_look(5, True)["pareto"] == "true" and trial_look(5, False)["mlflow.runName"] == "trial-5"
    for on_front in (True, False):
        colours = [_rgb(run_colour(n, on_front)) for n in range(20)]
        closest = min(sum((a - b) ** 2 for a, b in zip(c, d)) ** 0.5
                      for i, c in enumerate(colours) for d in colours[i + 1:])
        assert closest > 25, closest  # trials 5 and 8 were both red
    front, off = _rgb(run_colour(3, True)), _rgb(run_colour(3, False))
    assert max(front) - min(front) > max(off) - min(off)  # the front's colour is the saturated one
