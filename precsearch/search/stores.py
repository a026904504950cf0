"""Opening the Optuna storage, the MLflow tracker and the sampler, with clear errors."""

from __future__ import annotations

import os
from contextlib import contextmanager

import optuna

from precsearch.config.space import Sampler, StudySection
from precsearch.errors import UserError
from precsearch.search.workspace import Workspace


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage at ``url``; unreachable or malformed URLs are user errors."""
    try:
        if url.startswith(("sqlite:", "postgresql", "mysql")):
            return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
        if url.startswith("journal:"):
            backend = optuna.storages.journal.JournalFileBackend(url.removeprefix("journal:"))
            return optuna.storages.JournalStorage(backend)
    except Exception as exc:  # SQLAlchemy raises many kinds; all mean "cannot use this storage"
        raise UserError(f"cannot open Optuna storage '{url}': {_first_line(exc)}", field="study.storage") from None
    raise UserError(f"unsupported storage URL '{url}'; valid: sqlite:///PATH, postgresql://…, journal:PATH",
                    field="study.storage")


def _engine_kwargs(url: str) -> dict:
    if url.startswith("postgresql"):
        return {"connect_args": {"connect_timeout": 5}}
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


def open_tracker(ws: Workspace):
    """The study's MLflow tracker; an unreachable tracking URI is a user error."""
    from precsearch.tracking import Tracker

    try:
        with _fail_fast_http():
            return Tracker(ws.tracking_uri, ws.experiment, ws.artifact_dir, ws.study_name)
    except Exception as exc:  # MLflow raises MlflowException, requests' errors, SQLAlchemy's errors
        raise UserError(f"cannot use MLflow tracking URI '{ws.tracking_uri}': {_first_line(exc)}",
                        field="tracking.uri") from None


def make_sampler(study: StudySection) -> optuna.samplers.BaseSampler:
    """The sampler a space names, seeded."""
    if study.sampler is Sampler.TPE:
        return optuna.samplers.TPESampler(seed=study.seed, n_startup_trials=min(10, max(4, study.n_trials // 3)),
                                          multivariate=True)
    if study.sampler is Sampler.NSGA2:
        return optuna.samplers.NSGAIISampler(seed=study.seed, population_size=max(4, min(50, study.n_trials // 3)))
    if study.sampler is Sampler.GP:
        return optuna.samplers.GPSampler(seed=study.seed)
    return optuna.samplers.RandomSampler(seed=study.seed)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
