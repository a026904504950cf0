"""The ``precsearch`` logger: what a running study tells the user, one line per event, on standard output.

Library code logs through :func:`logger`; by default its records are written to the current
``sys.stdout`` (looked up per record, so a redirected or captured stdout gets them) through
``tqdm.write``, which puts the line above any progress bar instead of through it, and costs
nothing more than a print where none is shown. An application that wants the records elsewhere
replaces the handler (``logging.getLogger("precsearch").handlers``); records do not propagate to
the root logger, so a root handler does not print every line twice.
"""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

NAME = "precsearch"


class TqdmStdoutHandler(logging.Handler):
    """Writes each record's message to the current ``sys.stdout`` with ``tqdm.write``, then flushes."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stdout)
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


def logger() -> logging.Logger:
    """The ``precsearch`` logger, with the standard-output handler installed on first use."""
    log = logging.getLogger(NAME)
    if not log.handlers:
        handler = TqdmStdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log
