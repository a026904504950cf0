"""What Ctrl-C and SIGTERM mean to a study.

* The first Ctrl-C (SIGINT) asks for a clean stop: the trial in progress runs
  to its end and is recorded, then the run stops and says how to resume.
* A second Ctrl-C, or SIGTERM, stops at once: the trial in progress is
  closed as interrupted (its MLflow run KILLED) and its params queued again.

Handlers are installed only in the main thread (Python's rule for signals).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


class StopRequest:
    """Installs the handlers on ``__enter__`` and restores the previous ones on ``__exit__``."""

    def __init__(self, say: Callable[[str], None] = print):
        self.requested = False
        self._say = say
        self._saved: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._saved = {signal.SIGINT: signal.signal(signal.SIGINT, self._on_sigint),
                           signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_sigterm)}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved = {}

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._say("stopping after the current trial (Ctrl-C again to stop at once)")

    def _on_sigterm(self, signum, frame) -> None:
        self.requested = True
        raise KeyboardInterrupt
