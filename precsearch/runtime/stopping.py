"""What Ctrl-C and SIGTERM mean to a study.

* The first Ctrl-C (SIGINT) asks for a stop within a second: the probe in
  flight (a trial's or a BF16 reference's) is killed by its executor, which
  polls :attr:`StopRequest.requested`; its trial is closed as interrupted (its
  MLflow run KILLED) and its params queued again, so a resume runs it. A trial
  that is already being recorded is recorded first (a few seconds).
* A second Ctrl-C, or SIGTERM, raises ``KeyboardInterrupt`` at once, wherever
  the worker is; a trial it leaves RUNNING is recovered by the next run.
* After SIGTERM the process has :data:`TERM_GRACE_S` to close its trial and
  exit. Past that it prints every thread's stack and ends itself (status 1,
  :func:`precsearch.utils.processes.exit_after`): an interrupt
  lands anywhere, and a wait it broke half-way (a lock, a thread it never
  stopped) must not keep a killed run's worker alive, holding its trial
  RUNNING for the resumed run to wait on.

Handlers are installed only in the main thread (Python's rule for signals).

An interrupt can land where Python cannot raise it: in a weakref callback or a finalizer that garbage
collection runs (SQLAlchemy's ``_collection_gced`` under load in CI, 2026-12-07). Python then prints
"Exception ignored in ..." with a traceback and goes on, so the stop asked "at once" was lost. While a
:class:`StopRequest` is entered, :func:`sys.unraisablehook` takes such an interrupt and delivers it again
(SIGINT, whose handler raises once a stop is asked for), :data:`REDELIVER_S` later, past the hook. One that
lands in a callback again is delivered again.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager

from precsearch.utils.log import logger
from precsearch.utils.processes import exit_after


#: What a stopped run's last line says (the CLI's, once, after every worker has stopped).
RESUME_HINT = "stopped. Re-run the same command to resume: finished trials are kept."
#: How a worker command's last line begins (the driver of parallel workers says the end once for all).
WORKER_DONE = "worker done: "

#: What the first Ctrl-C is said to do (after ``stopping: ``).
STOP_NOTICE = "the probe in flight is stopped and its trial queued again (Ctrl-C again to stop at once)"

#: Seconds a process has after SIGTERM to close its trial and exit (an MLflow call's timeout is 30 s).
TERM_GRACE_S = 60.0


#: Seconds after an interrupt Python could not raise until it is delivered again (see the module's doc).
REDELIVER_S = 0.05


#: Where SQLAlchemy reports a cursor it could not close. An interrupt raised mid-query (the second Ctrl-C, SIGTERM)
#: can leave one whose connection the unwinding closed; its "Error closing cursor" traceback ("Cannot operate on a
#: closed database") then ran ahead of the resume hint (seen under load in CI, 2026-12-07). The run is ending:
#: nothing is lost with it.
INTERRUPTED_CLEANUP_LOGGERS = ("sqlalchemy.pool",)


def quiet_interrupted_cleanup() -> None:
    """Silence the storage's cleanup errors for the rest of a run an interrupt is ending (see above)."""
    for name in INTERRUPTED_CLEANUP_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


class StopRequest:
    """Installs the handlers on ``__enter__`` and restores the previous ones on ``__exit__``."""

    def __init__(self, say: Callable[[str], None] | None = None, term_grace_s: float = TERM_GRACE_S):
        self.requested = False
        self._say = say or logger().info
        self._saved: dict[int, object] = {}
        self._term_grace_s = term_grace_s
        self._saved_unraisable_hook = None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._saved = {signal.SIGINT: signal.signal(signal.SIGINT, self._on_sigint),
                           signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_sigterm)}
            self._saved_unraisable_hook, sys.unraisablehook = sys.unraisablehook, self._on_unraisable
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved = {}
        if self._saved_unraisable_hook is not None:
            sys.unraisablehook, self._saved_unraisable_hook = self._saved_unraisable_hook, None

    def _on_unraisable(self, unraisable) -> None:
        """An interrupt Python could not raise (it landed in a GC callback): no traceback; deliver it again."""
        if self.requested and unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            self._deliver_again_soon()
            return
        (self._saved_unraisable_hook or sys.__unraisablehook__)(unraisable)

    def _deliver_again_soon(self) -> None:
        """SIGINT to the main thread from a timer thread (sent from the hook, its handler would run in the hook),
        unless the handlers are gone by then (the stop ended: nothing is left to interrupt)."""
        def send() -> None:
            if self._saved:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

        timer = threading.Timer(REDELIVER_S, send)
        timer.daemon = True
        try:
            timer.start()
        except KeyboardInterrupt:  # another press landed while the timer started: the timer still sends its own
            pass

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:
            quiet_interrupted_cleanup()
            raise KeyboardInterrupt
        self.requested = True
        self._say(f"stopping: {STOP_NOTICE}")

    def _on_sigterm(self, signum, frame) -> None:
        self.requested = True
        exit_after(self._term_grace_s)  # the first SIGTERM's deadline stands (a second one does not move it)
        quiet_interrupted_cleanup()
        raise KeyboardInterrupt


@contextmanager
def deferred_signals():
    """Hold Ctrl-C and SIGTERM back while a few storage writes close a trial (milliseconds).

    A second Ctrl-C landing between them would leave the trial RUNNING; held back, it is raised
    right after. A no-op outside the main thread.

    Two layers hold it: the signals are blocked, so one arriving now waits in the kernel; and the Python
    handlers are swapped for one that notes the signal, because one that arrived just before the block
    has already been taken by the C-level handler and would run its Python handler at the next bytecode,
    inside the block (seen under load: a trial left RUNNING with its ``interrupted`` mark set). Both are
    delivered to the restored handlers when the block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    noted: list[int] = []
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    handlers = {signum: signal.signal(signum, lambda signum, frame: noted.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # one that waited in the kernel runs now
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)
