"""A trial's heartbeat: recorded while it runs, and never the thing that keeps a stopped worker alive."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import optuna

from precsearch.runtime.liveness import Heartbeat


def _storage(tmp_path, interval: int = 1) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat_interval=interval,
                                      grace_period=2 * interval)


def _until_stale(storage, study_id: int, trial_id: int, timeout_s: float = 20.0) -> None:
    """Wait until the trial's heartbeat is older than the grace period (2 s, read against the database's clock,
    whole seconds in SQLite): a thread still beating would keep it fresh for ever."""
    deadline = time.monotonic() + timeout_s
    while storage._get_stale_trial_ids(study_id) != [trial_id]:
        assert time.monotonic() < deadline, f"trial {trial_id} still has a fresh heartbeat after {timeout_s:.0f} s"
        time.sleep(0.5)


def test_the_heartbeat_is_recorded_while_the_block_runs_and_stops_after(tmp_path):
    storage = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    with Heartbeat(trial._trial_id, study._storage) as beat:
        assert beat._thread.daemon and beat._thread.is_alive()
        time.sleep(0.3)
        assert storage._get_stale_trial_ids(study._study_id) == []
    assert not beat._thread.is_alive()
    _until_stale(storage, study._study_id, trial._trial_id)  # past the grace with no beat


def test_no_thread_without_heartbeats(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}")
    trial = study.ask()
    before = threading.active_count()
    with Heartbeat(trial._trial_id, study._storage):
        assert threading.active_count() == before


# the main thread ends (an interrupt) without leaving the block: the process must still exit, and its trial go stale
_ENDS_MID_TRIAL = """
import sys, time, optuna
from precsearch.runtime.liveness import Heartbeat
storage = optuna.storages.RDBStorage(sys.argv[1], heartbeat_interval=1, grace_period=2)
study = optuna.create_study(storage=storage, study_name="s")
trial = study.ask()
Heartbeat(trial._trial_id, study._storage).__enter__()  # as if the interrupt landed before the block's exit
print("beating", flush=True)
time.sleep(1.5)  # a beat or two recorded
raise KeyboardInterrupt
"""


def test_a_worker_whose_main_thread_ended_mid_trial_exits_and_stops_beating(tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    proc = subprocess.Popen([sys.executable, "-c", _ENDS_MID_TRIAL, url], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)  # Optuna's own (non-daemon) heartbeat thread would hang here for ever
    assert out.strip() == "beating" and proc.returncode != 0
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2)
    study = optuna.load_study(study_name="s", storage=storage)
    _until_stale(storage, study._study_id, study.trials[0]._trial_id)
