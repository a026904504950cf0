"""Telling dead workers from live ones, and retrying stores with backoff."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from precsearch.runtime.liveness import WorkerId
from precsearch.utils.retry import StoreUnavailable, with_retry


def test_this_process_is_alive_and_a_finished_one_is_dead():
    assert not WorkerId.current().is_dead()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    worker = WorkerId(WorkerId.current().host, proc.pid, 0)
    proc.wait()
    assert worker.is_dead()


def test_a_reused_pid_is_not_the_same_worker():
    me = WorkerId.current()
    assert WorkerId(me.host, me.pid, me.started + 1).is_dead()  # same pid, another start time


def test_workers_on_other_hosts_are_never_declared_dead():
    assert not WorkerId("some-other-host", 1, 0).is_dead()  # only heartbeats can tell


def test_round_trip_through_trial_attrs():
    me = WorkerId.current()
    assert WorkerId.from_dict(me.to_dict()) == me
    assert WorkerId.from_dict(None) is None and WorkerId.from_dict({"host": "x"}) is None


def test_transient_errors_are_retried_until_success():
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionError("connection refused")
        return "ok"

    assert with_retry(flaky, "test store", budget_s=10, first_delay_s=0.05) == "ok"
    assert len(calls) == 3
    assert calls[2] - calls[1] >= calls[1] - calls[0]  # backoff grows


def test_retry_budget_ends_in_a_clear_user_error():
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"MLflow log_batch failed \d+ times over 1 s.*re-run"):
        with_retry(lambda: (_ for _ in ()).throw(ConnectionError("refused")), "MLflow log_batch", budget_s=1,
                   first_delay_s=0.1)
    assert time.monotonic() - start < 3


def test_programming_errors_are_not_retried():
    calls = []

    def broken():
        calls.append(1)
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        with_retry(broken, "x", budget_s=10)
    assert calls == [1]


def test_error_messages_hide_passwords():
    with pytest.raises(StoreUnavailable) as info:
        with_retry(lambda: (_ for _ in ()).throw(ConnectionError("postgresql://u:hunter2@db/x refused")), "db",
                   budget_s=0.1, first_delay_s=0.05)
    assert "hunter2" not in str(info.value)


def test_a_study_waits_out_database_errors_in_every_storage_call_it_makes(tmp_path, monkeypatch):
    """CI (PostgreSQL stopped for 5 s): a trial's suggestion failed at once, because Optuna's study calls its
    storage's private methods (``_set_trial_param``, ``_get_trials``, ...), which the retries did not cover.
    Here a third of the database sessions fail, at random, through one whole trial and the reads after it."""
    import random
    from contextlib import contextmanager

    import optuna
    import sqlalchemy.exc
    from optuna.storages._rdb import storage as rdb

    from precsearch.config.space import StudySection
    from precsearch.runtime.stores import open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}", StudySection(store_retry_s=60))
    study = optuna.create_study(storage=storage, directions=["minimize", "minimize"])
    real, rng, failed = rdb._create_scoped_session, random.Random(0), []

    @contextmanager
    def flaky(*args, **kwargs):
        if rng.random() < 1 / 3:
            failed.append(1)
            raise optuna.exceptions.StorageInternalError("commit failed") from sqlalchemy.exc.OperationalError(
                "COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))
        with real(*args, **kwargs) as session:
            yield session

    monkeypatch.setattr(rdb, "_create_scoped_session", flaky)
    monkeypatch.setattr("precsearch.utils.retry.time.sleep", lambda s: None)
    for _ in range(3):
        trial = study.ask()
        trial.suggest_categorical("mlp", ["bf16", "fp8_block"])
        trial.suggest_int("warmup_steps", 0, 8)
        trial.set_user_attr("worker", "w")
        study.tell(trial, [0.1, 0.2])
    monkeypatch.setattr(rdb, "_create_scoped_session", real)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert len(failed) >= 5
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert all(set(t.params) == {"mlp", "warmup_steps"} and t.user_attrs == {"worker": "w"} for t in trials)


def test_a_write_that_went_through_but_lost_its_reply_is_not_made_twice(tmp_path, monkeypatch):
    """The connection drops after the commit: the retry meets its own write (the param already set, the
    trial already finished) and takes it as done, instead of failing the study or writing it twice."""
    from contextlib import contextmanager

    import optuna
    import sqlalchemy.exc
    from optuna.storages._rdb import storage as rdb

    from precsearch.config.space import StudySection
    from precsearch.runtime.stores import open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}", StudySection(store_retry_s=60))
    study = optuna.create_study(storage=storage, directions=["minimize"])
    real, lose = rdb._create_scoped_session, []

    @contextmanager
    def reply_lost(*args, **kwargs):
        with real(*args, **kwargs) as session:
            yield session
            wrote = bool(session.new or session.dirty)  # a write, not one of the reads before it
        if lose and wrote:  # committed; then the reply is lost
            lose.clear()
            raise optuna.exceptions.StorageInternalError("connection lost") from sqlalchemy.exc.OperationalError(
                "COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))

    monkeypatch.setattr(rdb, "_create_scoped_session", reply_lost)
    monkeypatch.setattr("precsearch.utils.retry.time.sleep", lambda s: None)
    trial = study.ask()
    lose.append(1)
    assert trial.suggest_int("warmup_steps", 0, 8) in range(9)
    lose.append(1)
    study.tell(trial, 0.5)
    monkeypatch.setattr(rdb, "_create_scoped_session", real)
    (stored,) = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert stored.state is optuna.trial.TrialState.COMPLETE and stored.values == [0.5]
    assert list(stored.params) == ["warmup_steps"] and not lose
