"""Trials whose policy was already scored: told to Optuna at once, never paid as a trial.

Probes are seeded, so the same params at the same rung give the same result again. A sampler
proposes such a point again (TPE near its optimum, a random sampler by chance, any sampler
re-seeded on resume); the trial is then told the values of its finished twin, so the sampler
learns nothing new but sees its answer, and marked ``duplicate_of``. A duplicate runs no
probe, makes no MLflow run, has no row in the front and does not count towards ``n_trials``:
a study ends with the number of distinct policies asked for. Twins are looked up in the same
study only, whose settings :mod:`precsearch.runtime.identity` keeps unchanged, so no result is
ever copied across settings. With several workers, a proposal equal to a policy another worker
is still running (at a lower trial number) waits for that twin and then takes its values
(:func:`await_twin`); if the twin fails, it runs itself.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from precsearch.search import promotion
from precsearch.utils.processes import wait_unless
from precsearch.utils.retry import with_retry

DUPLICATE_OF = "duplicate_of"

#: Proposals in a row that were all duplicates before a worker takes the space as exhausted.
MAX_DUPLICATES_IN_A_ROW = 100


def is_duplicate(trial: FrozenTrial) -> bool:
    return DUPLICATE_OF in trial.user_attrs


def finished_twin(study: optuna.Study, params: dict, rung: int) -> FrozenTrial | None:
    """The scored trial with ``params`` at ``rung``, or None."""
    first = study.user_attrs.get("space", {}).get("probe", {}).get("steps", rung)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.params == params and "score" in t.user_attrs and not is_duplicate(t) \
                and promotion.rung_of(t, first) == rung:
            return t
    return None


def await_twin(study: optuna.Study, trial: optuna.Trial, rung: int, poll_s: float,
               stopping: Callable[[], bool], check: Callable[[], None] = lambda: None) -> FrozenTrial | None:
    """The finished twin of ``trial``'s params at ``rung``, after waiting for a lower-numbered twin
    another worker is running; None when there is none (or it failed, or a stop was asked for).

    Only a lower number is waited for, so two running twins never wait for each other. The running
    twins are read before the finished ones: read the other way, a twin finishing between the two
    reads was in neither, and its policy was run twice (seen with three workers on PostgreSQL).
    ``check`` runs at every poll (the caller's heartbeat check): a twin whose worker died is failed
    only if someone looks, and a worker waiting here looks at nothing else.
    """
    first = study.user_attrs.get("space", {}).get("probe", {}).get("steps", rung)
    while True:
        running = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.number < trial.number and t.params == trial.params and not is_duplicate(t)
                   and not promotion.is_promoted(t) and promotion.rung_of(t, first) == rung]
        twin = finished_twin(study, trial.params, rung)
        if twin is not None or stopping() or not running:
            return twin
        check()
        wait_unless(stopping, poll_s)  # a stop request ends the wait within 0.05 s


def tell_duplicate(study: optuna.Study, trial: optuna.Trial, twin: FrozenTrial, retry_s: float) -> None:
    """Close ``trial`` as a duplicate of ``twin``: COMPLETE with the twin's values and constraint."""
    trial.set_user_attr(DUPLICATE_OF, twin.number)
    for key, value in twin.constraints.items():
        trial.set_constraint(key, value)
    with_retry(lambda: study.tell(trial, twin.values), "recording the trial", budget_s=retry_s)
