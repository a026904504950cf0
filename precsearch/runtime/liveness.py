"""Which process runs a trial, and whether it is still alive.

Two mechanisms find trials whose worker died (OOM-kill, node loss, SIGKILL):

* **Heartbeats** (Optuna's, for RDB storages): every worker records a heartbeat
  for its running trial every ``study.heartbeat_s`` seconds; before each new
  trial, every worker fails the trials whose heartbeat is older than the grace
  period and queues them again (:class:`StaleTrialHandler`). This works across
  machines.
* **Process identity**, at the start of ``precsearch run``: a trial records the
  host, pid and process start time of its worker; a RUNNING trial whose worker
  is on this host and no longer alive is recovered at once, without waiting
  for the grace period (what a re-run after a kill needs).
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import asdict, dataclass

import optuna
import psutil
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

from precsearch.search.optuna_adapter import heartbeat_enabled
from precsearch.utils.log import logger

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class WorkerId:
    """A process, told apart from a later one that reuses its pid."""

    host: str
    pid: int
    started: int  # process start time in clock ticks since boot (Linux); 0 where unknown

    @classmethod
    def current(cls) -> "WorkerId":
        return cls(socket.gethostname(), os.getpid(), _start_time(os.getpid()))

    @classmethod
    def from_dict(cls, data: dict | None) -> "WorkerId | None":
        try:
            return cls(str(data["host"]), int(data["pid"]), int(data.get("started", 0)))
        except (TypeError, KeyError, ValueError):
            return None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    def is_local(self) -> bool:
        return self.host == socket.gethostname()

    def is_dead(self) -> bool:
        """True only when the process is on this host and certainly gone."""
        if not self.is_local():
            return False
        started = _start_time(self.pid)
        if started is None:
            return True
        return bool(self.started) and started != self.started


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (as ``/proc/PID/stat`` has it, so ids recorded by
    earlier versions compare equal); None if no such process, 0 if unknown."""
    try:
        process = psutil.Process(pid)
        if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return None  # a zombie has exited; only its parent has not collected it yet
        started_s = process.create_time() - psutil.boot_time()
    except psutil.NoSuchProcess:
        return None
    except (psutil.AccessDenied, OSError):
        return 0
    return round(started_s * _CLOCK_TICKS)


def trial_worker(trial: FrozenTrial) -> WorkerId | None:
    return WorkerId.from_dict(trial.user_attrs.get("worker"))


class Heartbeat:
    """Record ``trial_id``'s heartbeat every ``heartbeat_interval`` s while the block runs (RDB storages).

    Optuna's own heartbeat thread is not a daemon: a SIGTERM that lands between its start and the block
    (or in its stop) leaves it beating after the worker's main thread has ended, and the worker never
    exits, so its trial looks alive for ever and a resumed study waits on it. This one is a daemon: the
    process's end ends it, and the trial goes to the dead-worker and stale-heartbeat checks.
    """

    def __init__(self, trial_id: int, storage: optuna.storages.BaseStorage):
        self._trial_id, self._storage = trial_id, storage
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Heartbeat":
        if heartbeat_enabled(self._storage):
            interval = self._storage.get_heartbeat_interval()
            self._thread = threading.Thread(target=self._beat, args=(interval,), name="precsearch-heartbeat",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self, interval: float) -> None:
        while True:
            self._storage.record_heartbeat(self._trial_id)
            if self._stop.wait(timeout=interval):
                return


class StaleTrialHandler:
    """Optuna's heartbeat-stale callback: queue the trial again, and close its MLflow run as failed.

    ``tracker`` is set once the MLflow tracker exists (the storage is opened first).
    """

    def __init__(self, max_retry: int, heartbeat_s: int, grace_s: int):
        self._retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.tracker = None
        self.say = logger().info

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._retry(study, trial)
        worker = trial_worker(trial)
        reason = f"worker {worker or '?'} lost: no heartbeat for {self.grace_s} s"
        run_id = trial.user_attrs.get("mlflow_run_id")
        if run_id and self.tracker is not None:
            self.tracker.fail_trial(run_id, reason, "FAILED")
        self.say(f"trial {trial.number}: {reason}; failed and queued again")
