"""Opening the Optuna storage, the MLflow tracker and the sampler, with clear errors."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import optuna

from precsearch.config.space import StudySection
from precsearch.errors import UserError
from precsearch.redact import first_line, redact_url
from precsearch.runtime.workspace import Workspace
from precsearch.search import proposals
from precsearch.search.optuna_adapter import CACHED_STORAGE_CALLS


def open_storage(url: str, study: StudySection | None = None) -> optuna.storages.BaseStorage:
    """The Optuna storage at ``url``; unreachable or malformed URLs are user errors.

    With ``study``, RDB storages get heartbeats: a trial whose worker stops beating for
    ``study.stale_after_s`` is failed, its MLflow run closed, and its params queued again (up to
    ``study.max_retries`` times). Journal storages have no heartbeats.
    """
    try:
        if url.startswith(("sqlite:", "postgresql", "mysql")):
            storage = _new_rdb_storage(url, _heartbeat_kwargs(study))
            return _retrying(storage, study.store_retry_s) if study is not None else storage
        if url.startswith("journal:"):
            backend = optuna.storages.journal.JournalFileBackend(url.removeprefix("journal:"))
            return optuna.storages.JournalStorage(backend)
    except ModuleNotFoundError as exc:
        raise UserError(f"storage '{redact_url(url)}' needs the Python package '{exc.name}'; for PostgreSQL: "
                        "pip install 'precsearch[postgres]'", field="study.storage") from None
    except Exception as exc:  # SQLAlchemy raises many kinds; all mean "cannot use this storage"
        raise UserError(f"cannot open Optuna storage '{redact_url(url)}': {first_line(exc)}",
                        field="study.storage") from None
    raise UserError(f"unsupported storage URL '{redact_url(url)}'; valid: sqlite:///PATH, postgresql://…, "
                    "journal:PATH", field="study.storage")


#: How often opening a new database is tried again when another process is creating its tables.
SCHEMA_RACE_ATTEMPTS = 5


def _new_rdb_storage(url: str, heartbeat: dict) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage, tried again when another process created the same new database's tables first.

    Optuna checks for each table, then creates it; two processes opening one new SQLite file at once (a
    second worker, ``precsearch front`` at a run's start) both see it missing and one fails with
    "table ... already exists" (or a duplicate version row). A second try finds the tables made.
    """
    for attempt in range(1, SCHEMA_RACE_ATTEMPTS + 1):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), **heartbeat)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's OperationalError / IntegrityError
            if attempt == SCHEMA_RACE_ATTEMPTS or not _lost_schema_race(exc):
                raise
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def _lost_schema_race(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ in ("OperationalError", "IntegrityError", "ProgrammingError") and (
        "already exists" in text or "UNIQUE constraint failed" in text or "duplicate key" in text)


#: The storage calls a study makes (Optuna's BaseStorage and heartbeat API), retried while the database is away.
_STORAGE_CALLS = (
    "create_new_study", "set_study_user_attr", "set_study_system_attr", "get_study_id_from_name",
    "get_study_name_from_id", "get_study_directions", "get_study_user_attrs", "get_study_system_attrs",
    "get_all_studies", "create_new_trial", "set_trial_param", "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id", "get_trial_param", "set_trial_state_values", "set_trial_intermediate_value",
    "set_trial_user_attr", "set_trial_system_attr", "get_trial", "get_all_trials", "get_n_trials",
    "get_best_trial", "get_trial_params", "get_trial_user_attrs", "get_trial_system_attrs",
    "check_trial_is_updatable", "record_heartbeat",
    # and what the study's own wrapper calls instead of the public names above: without these, a trial's
    # suggestions and every read of the study's trials skipped the retries
    *CACHED_STORAGE_CALLS,
)


def _retrying(storage: optuna.storages.RDBStorage, budget_s: float) -> optuna.storages.RDBStorage:
    """Make every storage call of ``storage`` retry while the database is unreachable (see retry.py).

    The instance's methods are replaced, so Optuna's own objects (the study, its trials, the
    heartbeat thread) go through the retries too. A state change whose reply was lost is not
    made twice: if its retry finds the trial already finished, the first attempt went through; a param
    set again meets the unique (trial, name) row, an IntegrityError Optuna's ``_set_trial_param`` ignores.
    """
    if budget_s <= 0:
        return storage
    from precsearch.utils.retry import with_retry

    def wrap(name: str, method):
        def call(*args, **kwargs):
            attempts = 0

            def once():
                nonlocal attempts
                attempts += 1
                if attempts > 1:  # a failed call leaves a broken session and dead pooled connections
                    storage.remove_session()
                    storage.engine.dispose()
                try:
                    return method(*args, **kwargs)
                except optuna.exceptions.UpdateFinishedTrialError:
                    if attempts > 1 and name == "set_trial_state_values":
                        return True
                    raise

            return with_retry(once, f"the Optuna database ({name})", budget_s=budget_s)

        return call

    for name in _STORAGE_CALLS:
        setattr(storage, name, wrap(name, getattr(storage, name)))
    return storage


def _heartbeat_kwargs(study: StudySection | None) -> dict:
    if study is None:
        return {}
    from precsearch.runtime.liveness import StaleTrialHandler

    grace = study.stale_after_s or 3 * study.heartbeat_s
    handler = StaleTrialHandler(study.max_retries, study.heartbeat_s, grace)
    return {"heartbeat_interval": study.heartbeat_s, "grace_period": grace,
            "heartbeat_stale_trial_callback": handler}


def _engine_kwargs(url: str) -> dict:
    if url.startswith("postgresql"):
        return {"connect_args": {"connect_timeout": 5}, "pool_pre_ping": True}
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}  # several local workers share the file: wait for the lock
    return {}


@contextmanager
def _fail_fast_http():
    """Make MLflow's HTTP client give up in seconds instead of retrying for minutes."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def open_tracker(ws: Workspace, parent_id: str | None = None, retry_s: float = 0.0):
    """The study's MLflow tracker; an unreachable tracking URI is a user error (in seconds, no retries)."""
    from precsearch.tracking import Tracker

    try:
        with _fail_fast_http():
            tracker = Tracker(ws.tracking_uri, ws.experiment, ws.artifact_dir, ws.study_name, parent_id=parent_id)
    except Exception as exc:  # MLflow raises MlflowException, requests' errors, SQLAlchemy's errors
        raise UserError(f"cannot use MLflow tracking URI '{redact_url(ws.tracking_uri)}': {first_line(exc)}",
                        field="tracking.uri") from None
    return tracker.with_retries(retry_s)


def make_sampler(study: StudySection, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler a space names, seeded (``seed_offset`` gives parallel workers different streams).

    It proposes only where a worker asks with the study's queue empty (workers on several machines asking at
    once): every other trial's params come from a seeded batch (:mod:`precsearch.search.proposals`).
    """
    # numpy RandomState takes 0..2**32-1: a worker's offset (and a resume's trial count) must not push
    # study.seed (at most 2**32 - 1) past it
    return proposals.make_sampler(study, (study.seed + seed_offset) % 2**32)
