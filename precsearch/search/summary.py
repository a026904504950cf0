"""Where a study stands, in numbers: what the study run in MLflow and the terminal's status line report."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from precsearch.search import promotion
from precsearch.search.duplicate_trials import is_duplicate
from precsearch.search.hypervolume import hypervolume
from precsearch.search.scoring import DIRECTIONS, DIVERGED_INSTABILITY

#: The hypervolume's reference point: no memory saved, a diverged probe's instability, no throughput.
HV_REFERENCE = {"memory_saved": 0.0, "instability": DIVERGED_INSTABILITY, "tokens_per_s": 0.0}


def study_metrics(rows: list[dict[str, Any]], finished: int, objectives: list[str]) -> dict[str, float]:
    """The study-level metrics of the trial rows (:func:`~precsearch.search.front.trial_rows`).

    ``trials_finished`` counts finished trials (failed ones too, as ``n_trials`` does); ``trials_scored``,
    ``trials_feasible`` and ``front_size`` count rows; ``hypervolume`` is that of the feasible trials
    against :data:`HV_REFERENCE` (2 or 3 objectives only); ``best_memory_saved`` is the most memory a
    feasible trial saves, i.e. at the stability limit (absent while no trial is feasible).
    """
    feasible = [r for r in rows if r["feasible"]]
    metrics = {"trials_finished": float(finished), "trials_scored": float(len(rows)),
               "trials_feasible": float(len(feasible)), "front_size": float(sum(1 for r in rows if r["pareto"]))}
    if len(objectives) in (2, 3):
        points = [[r[name] for name in objectives] for r in feasible]
        metrics["hypervolume"] = hypervolume(points, [DIRECTIONS[n] for n in objectives],
                                             [HV_REFERENCE[n] for n in objectives])
    if feasible:
        metrics["best_memory_saved"] = max(r["memory_saved"] for r in feasible)
    return metrics


def finished_count(study: optuna.Study) -> int:
    """Trials that count towards ``n_trials``: complete, or failed by their own probe.

    Trials failed because their run was interrupted or their worker died are not counted: their
    params are queued again. Promoted evaluations (longer rungs of the same policies) and duplicates
    (:mod:`precsearch.search.duplicate_trials`) are not counted.
    """
    return finished_in(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)))


def finished_in(trials) -> int:
    """:func:`finished_count` of a list of trials already read (any states)."""
    return sum(1 for t in trials
               if (t.state is TrialState.COMPLETE or (t.state is TrialState.FAIL and "fail_reason" in t.user_attrs))
               and not promotion.is_promoted(t) and not is_duplicate(t))
