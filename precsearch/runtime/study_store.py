"""The Optuna study in its storage: created or loaded, checked against the space, seeded for a resume.

A study created here records what workers and later commands need (objectives, the space, the
MLflow experiment and parent run). A loaded one must have been scored under the same settings
(:mod:`precsearch.runtime.identity`). The policies trials run are proposed in seeded batches
(:mod:`precsearch.search.proposals`); the study's own sampler proposes only for a worker that asks with
the queue empty (workers on several machines at once). It is seeded past the known trials on a resume:
the seed's first points are the ones already scored, and each would come back as a duplicate.
"""

from __future__ import annotations

import warnings

import optuna

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.runtime import stores
from precsearch.runtime.identity import check_storage
from precsearch.runtime.lost_stores import retire_earlier_runs
from precsearch.runtime.workspace import Workspace
from precsearch.search.scoring import DIRECTIONS, objective_names
from precsearch.tracking import Tracker


def open_study(space: Space, ws: Workspace, storage: optuna.storages.BaseStorage, tracker: Tracker,
               sampler_offset: int = 0) -> optuna.Study:
    """The study ``space`` names in ``storage``, created if missing.

    Raises:
        UserError: the stored study was scored under other settings, or this directory's storage holds
            another study.
    """
    check_storage(storage, ws, space)
    names = objective_names(space.objectives)
    study = optuna.create_study(study_name=space.study.name, storage=storage, directions=[DIRECTIONS[n] for n in names],
                                sampler=stores.make_sampler(space.study, sampler_offset), load_if_exists=True)
    stored = study.user_attrs.get("objectives")
    if study.metric_names is None:  # optuna-dashboard and Optuna's plots name the objectives with these
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)
    if stored is None:
        retire_earlier_runs(tracker, space.study.name)
        study.set_user_attr("objectives", names)
        study.set_user_attr("space", space.model_dump(mode="json"))
        study.set_user_attr("experiment", tracker.experiment_name)
        study.set_user_attr("mlflow_parent_run_id", tracker.parent_id)
    elif stored != names:
        raise UserError(f"study '{space.study.name}' in this storage optimises {stored}, not {names}; "
                        f"use another study.name or --output-dir", field="study.name")
    if known := len(study.get_trials(deepcopy=False)):
        study.sampler = stores.make_sampler(space.study, sampler_offset + known)
    return study


def run_ids(study: optuna.Study) -> dict[int, str]:
    """Trial number -> its MLflow run id, for the trials that have one."""
    return {t.number: t.user_attrs["mlflow_run_id"] for t in study.get_trials(deepcopy=False)
            if "mlflow_run_id" in t.user_attrs}
