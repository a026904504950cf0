"""Closing an interrupted trial survives a store error: a second Ctrl-C once ended in SQLAlchemy's traceback
(``OperationalError`` while the trial was being closed, seen under load in the full suite)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy.exc import OperationalError

from precsearch.runtime import _optimize


def _ctx(study: optuna.Study) -> SimpleNamespace:
    return SimpleNamespace(study=study, name="", tracker=None)


def _locked() -> OperationalError:
    return OperationalError("UPDATE trials ...", {}, Exception("database is locked"))


@pytest.fixture
def study(tmp_path):
    s = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", study_name="t")
    s.enqueue_trial({"x": 1.0})
    return s


def test_a_write_that_fails_once_is_retried_and_the_trial_closed_and_queued_again(study, monkeypatch):
    trial = study.ask()
    trial.suggest_float("x", 0, 2)
    real, calls = study.tell, []

    def tell_once_locked(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise _locked()
        return real(*args, **kwargs)

    monkeypatch.setattr(study, "tell", tell_once_locked)
    monkeypatch.setattr(_optimize, "ABANDON_RETRY_S", 2.0)
    _optimize._abandon(_ctx(study), trial, None, "interrupted")
    frozen = study.trials[trial.number]
    assert len(calls) == 2 and frozen.state is TrialState.FAIL and frozen.user_attrs["interrupted"]
    assert [t.system_attrs["fixed_params"] for t in study.trials if t.state is TrialState.WAITING] == [{"x": 1.0}]


def test_a_store_that_stays_locked_is_said_in_a_line_and_left_to_the_next_run(study, monkeypatch, caplog):
    trial = study.ask()
    trial.suggest_float("x", 0, 2)

    def locked(*args, **kwargs):
        raise _locked()

    monkeypatch.setattr(study, "tell", locked)
    monkeypatch.setattr(_optimize, "ABANDON_RETRY_S", 0.3)
    with caplog.at_level(logging.INFO):
        _optimize._abandon(_ctx(study), trial, None, "interrupted")  # no exception: the worker goes on stopping
    assert study.trials[trial.number].state is TrialState.RUNNING  # the next run's recover_dead_trials closes it
    assert any("could not close it now" in r.getMessage() and "database is locked" in r.getMessage()
               for r in caplog.records)
