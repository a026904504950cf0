"""Trials whose policy was already scored: told to Optuna at once, never paid as a trial.

Probes are seeded, so the same params at the same rung give the same result again. A sampler
proposes such a point again (TPE near its optimum, a random sampler by chance, any sampler
re-seeded on resume); the trial is then told the values of its finished twin, so the sampler
learns nothing new but sees its answer, and marked ``duplicate_of``. A duplicate runs no
probe, makes no MLflow run, has no row in the front and does not count towards ``n_trials``:
a study ends with the number of distinct policies asked for. Twins are looked up in the same
study only, whose settings :mod:`precsearch.search.identity` keeps unchanged, so no result is
ever copied across settings.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from precsearch.search import promotion
from precsearch.search.retry import with_retry

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


def tell_duplicate(study: optuna.Study, trial: optuna.Trial, twin: FrozenTrial, retry_s: float) -> None:
    """Close ``trial`` as a duplicate of ``twin``: COMPLETE with the twin's values and constraint."""
    trial.set_user_attr(DUPLICATE_OF, twin.number)
    for key, value in twin.constraints.items():
        trial.set_constraint(key, value)
    with_retry(lambda: study.tell(trial, twin.values), "recording the trial", budget_s=retry_s)
