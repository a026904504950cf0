"""Every reach into Optuna's private API, in one place: the storage under a study, a trial's storage id,
the keys Optuna keeps in a trial's system attributes, the heartbeat check.

Each one says which public API is missing. All were checked against Optuna :data:`CHECKED_AGAINST`; an Optuna
upgrade re-reads this module only (``tests/search/test_optuna_adapter.py`` fails on an Optuna private name
used anywhere else in the package, and runs each function here against the installed Optuna).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import FrozenTrial, TrialState

#: The Optuna version every reach below was read against.
CHECKED_AGAINST = "5.1.0"

#: The storage methods Optuna's ``_CachedStorage`` (the wrapper a study puts around an RDB storage) calls instead
#: of the public ones of the same name: a wrapper of the storage's calls (retries) must wrap these too, or a
#: trial's suggestions and every read of the study's trials bypass it. Missing: a public list (there is none).
CACHED_STORAGE_CALLS: tuple[str, ...] = ("_get_stale_trial_ids", "_create_new_trial", "_set_trial_param",
                                         "_get_trials", "_get_best_trial_id")

#: The system attribute ``Study.enqueue_trial`` stores a queued trial's params under (``study.py``). Missing: a
#: public reader of a WAITING trial's params (``FrozenTrial.params`` is empty until the trial is asked).
_FIXED_PARAMS = "fixed_params"
#: The prefix of the system attributes ``Trial.set_constraint`` writes (``_constrained_optimization.py``).
#: Missing: a way to copy a trial's constraints into ``create_trial`` other than its system attributes.
_CONSTRAINTS = "constraints"


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes (``Study._storage``). Missing: a public ``Study.storage``; a
    heartbeat thread and reads by trial id need the storage itself."""
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage (``_trial_id``), which a later process reads it back by. Missing: a public
    id (``number`` is per study; the storage API is keyed by id)."""
    return trial._trial_id


def stored_trial(study: optuna.Study, trial_id: int) -> FrozenTrial:
    """The trial with storage id ``trial_id`` as the storage holds it now, read without listing the study.
    Missing: ``Study.get_trial``; ``get_trials`` reads every trial (and may serve a cached copy)."""
    return storage_of(study).get_trial(trial_id)


def reread(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial:
    """``trial`` as the storage holds it now (another process may have changed its state); see
    :func:`stored_trial`."""
    return stored_trial(study, trial_id(trial))


def fail_as_interrupted(study: optuna.Study, trial: FrozenTrial) -> None:
    """Mark another process's RUNNING ``trial`` FAIL with the user attribute ``interrupted``. Missing: a public
    way to set a user attribute of a trial this process did not ask; ``Study.tell`` by number also runs the
    sampler's ``after_trial`` and Optuna's log line, which a trial of a dead worker should not."""
    storage = storage_of(study)
    storage.set_trial_user_attr(trial_id(trial), "interrupted", True)
    storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)


def queued_params(trial: FrozenTrial) -> dict[str, Any] | None:
    """The params a queued (``enqueue_trial``) trial runs with, None for one the sampler proposed."""
    return trial.system_attrs.get(_FIXED_PARAMS)


def is_constraint_attr(key: str) -> bool:
    """Whether a trial's system attribute ``key`` is one of its constraints (set by ``Trial.set_constraint``)."""
    return key.startswith(_CONSTRAINTS)


def heartbeat_enabled(storage: BaseStorage) -> bool:
    """Whether ``storage`` records heartbeats (an RDB storage opened with a heartbeat interval). Missing: the
    public form of ``optuna.storages._heartbeat.is_heartbeat_enabled``."""
    return is_heartbeat_enabled(storage)
