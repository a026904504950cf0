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
