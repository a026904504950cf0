"""When and where a told trial is written to MLflow: on a recorder thread, while the next probe trains.

A trial's MLflow record (per-step metrics, plots, tags, artifacts, the run closed FINISHED) and the
front update after it cost seconds per trial that the GPU would otherwise spend idle. The worker
therefore tells Optuna synchronously (that is what makes a trial count) and hands the rest to a
:class:`Recorder`: one thread, a bounded queue (a worker never runs more than ``depth`` trials
ahead of its records), the front updated once the queue runs dry (one update for a burst).

What survives a crash:

* Before the tell, the trial's record job is written to ``<output>/pending_records/<run id>.json``
  (atomic rename): the references it was scored against, its rung and its worker. Everything else
  a record needs is in the Optuna trial (``score``, the one scoring of the trial, read back and not
  scored again; ``probe_result``, ``stress_result``, ``policy``).
* The journal entry is removed only once the MLflow run is closed FINISHED.
* At start-up, :func:`replay_pending` writes the records of entries whose worker is gone, before the
  orphan runs are closed KILLED: a trial Optuna holds COMPLETE gets its full MLflow record back.
  An entry whose trial never reached COMPLETE (a kill before the tell) is dropped; that trial is
  failed and re-queued by the usual recovery.
* :meth:`Recorder.close` drains the queue at study end; after the first Ctrl-C it waits
  :data:`STOP_WAIT_S` at most (Ctrl-C ends in seconds, not after a record's plots), and a second
  Ctrl-C or SIGTERM stops at once, leaving the entries not written for the next run.

``PRECSEARCH_SYNC_RECORD=1`` records inline on the critical path, as before this module, for
``benchmarks/bench_probe.py`` to compare the two side by side; the journal is kept either way.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SYNC_ENV = "PRECSEARCH_SYNC_RECORD"
#: For the fault tests only: ``<point>`` at which the recorder SIGKILLs its own process, raises
#: (``raise:<point>``) or waits 3 s (``slow:<point>``); points are ``before_write``, ``after_steps``,
#: ``after_finish``. Nothing sets it otherwise.
FAULT_ENV = "PRECSEARCH_RECORD_FAULT"
_DIR = "pending_records"
#: Seconds the first Ctrl-C waits for records in flight: one nearly written ends; a trial's record (its plots)
#: takes 3-5 s on a busy CPU, so most are left to the journal, which the resumed run writes.
STOP_WAIT_S = 0.1


@dataclass(frozen=True)
class RecordJob:
    """What the recorder needs beside the Optuna trial to write a trial's MLflow record.

    Attributes:
        trial: The Optuna trial number.
        trial_id: Its id in the storage (to read it back without listing the study).
        run_id: Its MLflow run.
        rung: The steps it ran (its fidelity rung).
        references: The BF16 references it was scored against (``seeds``, ``stress``), as
            :meth:`ProbeResult.to_dict` data.
        worker: The worker process (``WorkerId.to_dict``) that owns the entry while it lives.
        study_metrics: The study's metrics right after this trial's tell, logged on the study run at
            its step even when one front update covers several trials.
    """

    trial: int
    trial_id: int
    run_id: str
    rung: int
    references: dict[str, Any]
    worker: dict[str, Any]
    study_metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RecordJob":
        return cls(**{k: data[k] for k in ("trial", "trial_id", "run_id", "rung", "references", "worker")},
                   study_metrics=data.get("study_metrics", {}))


def journal_dir(output_dir: Path) -> Path:
    """Where a study's pending record jobs live."""
    return Path(output_dir) / _DIR


def write_entry(output_dir: Path, job: RecordJob) -> Path:
    """Journal ``job`` (atomically: a crash leaves the old entry or the whole new one)."""
    directory = journal_dir(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{job.run_id}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(job.to_dict()))
    os.replace(tmp, path)
    return path


def drop_entry(output_dir: Path, run_id: str) -> None:
    """The job of ``run_id`` is recorded (or moot): forget it."""
    (journal_dir(output_dir) / f"{run_id}.json").unlink(missing_ok=True)


def pending(output_dir: Path) -> list[RecordJob]:
    """Every journalled job, oldest trial first; unreadable entries (half-written ``.tmp``) are skipped."""
    jobs = []
    for path in sorted(journal_dir(output_dir).glob("*.json")):
        try:
            jobs.append(RecordJob.from_dict(json.loads(path.read_text())))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(jobs, key=lambda j: j.trial)


def synchronous() -> bool:
    """Whether ``PRECSEARCH_SYNC_RECORD`` asks for the old inline recording."""
    return os.environ.get(SYNC_ENV, "").strip() not in ("", "0", "false", "no")


def fault(point: str) -> None:
    """The fault ``PRECSEARCH_RECORD_FAULT`` injects at ``point``, if any (tests only)."""
    spec = os.environ.get(FAULT_ENV, "")
    if spec == point:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if spec == f"raise:{point}":
        raise RuntimeError(f"injected recorder fault at {point}")
    if spec == f"slow:{point}":
        import time

        time.sleep(3.0)


class Recorder:
    """Writes record jobs on a thread, ``depth`` at most waiting; or inline when ``inline``.

    Args:
        write: Writes one job's MLflow record and closes its run FINISHED (raises on failure).
        after: Runs once the queue is empty after one or more writes (the front update).
        abandon: Closes the run of a job whose write raised (FAILED; best effort), so that it is not
            left RUNNING while the journal waits for the next run to write it again.
        output_dir: The study's directory, for the journal.
        depth: Jobs that may wait; :meth:`submit` blocks beyond (the probe loop waits for its records).
        inline: Record on the caller's thread, as before (``PRECSEARCH_SYNC_RECORD``).
    """

    def __init__(self, write: Callable[[RecordJob], None], after: Callable[[], None], output_dir: Path,
                 depth: int = 2, inline: bool = False,
                 abandon: Callable[[RecordJob, BaseException], None] | None = None):
        self._write, self._after, self._output_dir = write, after, Path(output_dir)
        self._abandon = abandon or (lambda job, exc: None)
        self.inline = inline
        self.error: BaseException | None = None
        self._queue: queue.Queue[RecordJob | None] = queue.Queue(maxsize=depth)
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, job: RecordJob) -> None:
        """Record ``job`` (journalled already); raises the error that stopped an earlier record."""
        if self.error is not None:
            self._close_run(job, self.error)
            raise self.error
        if self.inline:
            self._record(job)
            self._after()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="precsearch-recorder", daemon=True)
            self._thread.start()
        self._put(job)

    def close(self, wait_s: float | None = None, stopping: Callable[[], bool] | None = None) -> bool:
        """Write every waiting job (and the front after them); raises the error that stopped one.

        ``wait_s`` (after a Ctrl-C): wait that long at most, then :meth:`abandon` what is left to the journal
        (the next run writes it) and return False; True when every job was written. ``stopping``: polled while
        waiting without a limit; once it answers True (a Ctrl-C during the study's last records), the wait
        becomes :data:`STOP_WAIT_S`.
        """
        if self._thread is not None and not self._closed:
            self._closed = True
            deadline = None if wait_s is None else time.monotonic() + wait_s
            if self.error is None:
                if deadline is None:
                    self._put(None)
                else:
                    self._put_nowait(None)
            try:
                while self._thread.is_alive():
                    if deadline is None and stopping is not None and stopping():
                        deadline = time.monotonic() + STOP_WAIT_S
                    if deadline is not None and time.monotonic() >= deadline:
                        self.abandon()
                        return False
                    self._thread.join(timeout=0.05 if deadline is not None or stopping else 0.2)  # Ctrl-C stays deliverable
            except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM: leave the rest to the journal
                _exit_without_finalizing()
                raise
        if self.error is not None:  # a job put while the thread was giving up
            self._close_waiting(self.error)
        self._raise_error()
        return True

    def _put_nowait(self, item: RecordJob | None) -> None:
        """Queue ``item`` if there is room: with a deadline, a full queue is the journal's anyway."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            pass

    def abandon(self) -> None:
        """Stop without waiting (a second Ctrl-C, SIGTERM): queued and in-flight records stay journalled."""
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            _exit_without_finalizing()

    def _put(self, item: RecordJob | None) -> None:
        while True:
            self._raise_error()
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _loop(self) -> None:
        unfronted = False  # jobs written since the last front update
        while True:
            job = self._queue.get()
            if job is not None:
                try:
                    self._record(job)
                except BaseException as exc:  # noqa: BLE001 - handed to the worker's thread at its next submit/close
                    self._give_up(job, exc)
                    return
                unfronted = True
            try:
                if unfronted and self._queue.empty():
                    self._after()
                    unfronted = False
            except BaseException as exc:  # noqa: BLE001 - as above
                self.error = exc
                return
            if job is None:
                return

    def _give_up(self, job: RecordJob, exc: BaseException) -> None:
        """Stop recording: close ``job``'s run and those still queued (their entries stay for the next run)."""
        self.error = exc
        self._close_run(job, exc)
        self._close_waiting(exc)

    def _close_waiting(self, exc: BaseException) -> None:
        while True:
            try:
                waiting = self._queue.get_nowait()
            except queue.Empty:
                return
            if waiting is not None:
                self._close_run(waiting, exc)

    def _close_run(self, job: RecordJob, exc: BaseException) -> None:
        try:
            self._abandon(job, exc)
        except Exception:  # noqa: BLE001 - the store may be what failed; the journal keeps the job
            pass

    def _record(self, job: RecordJob) -> None:
        fault("before_write")
        try:
            self._write(job)
        except BaseException as exc:
            if self.inline:
                self._give_up(job, exc)
            raise
        fault("after_finish")
        drop_entry(self._output_dir, job.run_id)


def _exit_without_finalizing(status: int = 130) -> None:
    """At exit, end the process without the interpreter's finalization while a record may be in flight.

    A daemon thread frozen mid-call at interpreter shutdown can hold a lock (the tracking store's
    connection pool) that finalization then waits for: once in three runs of the two-Ctrl-C test the
    process printed its resume hint and never exited. The record is in the journal either way; only
    the stdio buffers need flushing.
    """
    import atexit
    import sys

    def hard_exit() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)

    atexit.register(hard_exit)
