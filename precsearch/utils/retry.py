"""Retrying calls to the study's stores (Optuna's database, the MLflow server) with backoff.

A store that drops out mid-study (a restarted Postgres, an MLflow server
that is redeployed) should cost a pause, not the study. Calls are retried
with exponential backoff for up to ``budget_s`` seconds; then
:class:`StoreUnavailable` says which store, what failed and how to resume.
Callers make each retried call safe to repeat (see ``Tracker.start_trial``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

from precsearch.errors import UserError
from precsearch.redact import first_line

T = TypeVar("T")


class StoreUnavailable(UserError):
    """A store stayed unreachable for the whole retry budget."""


def _transient(exc: BaseException) -> bool:
    """Connection-level failures are worth retrying; programming errors are not."""
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return True
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    if name == "StorageInternalError" and exc.__cause__ is not None:  # Optuna's wrapper of a database error
        cause = exc.__cause__
        return type(cause).__name__ in ("OperationalError", "InterfaceError") or _transient(cause)
    if module.startswith(("sqlalchemy", "psycopg", "requests", "urllib3")):
        return name not in ("IntegrityError", "ProgrammingError", "ArgumentError")
    if name == "MlflowException":
        text = str(exc)
        return any(s in text for s in ("Connection", "connect", "timed out", "Max retries", "503", "502", "504",
                                       "API request", "database is locked"))
    return False


def _to_stderr(message: str) -> None:
    print(f"precsearch: {message}", file=sys.stderr, flush=True)


def with_retry(call: Callable[[], T], what: str, *, budget_s: float = 60.0, first_delay_s: float = 0.5,
               say: Callable[[str], None] | None = _to_stderr) -> T:
    """``call()``, retried on connection errors with doubling delays for up to ``budget_s`` seconds.

    The first failure is reported through ``say`` (standard error by default), so a pause is explained.
    """
    deadline = time.monotonic() + budget_s
    delay, attempt = first_delay_s, 1
    while True:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - filtered by _transient
            if not _transient(exc):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(
                    f"{what} failed {attempt} times over {budget_s:.0f} s: {first_line(exc)}. "
                    "Finished trials are kept; re-run the same command once the store is back"
                ) from None
            if say and attempt == 1:
                say(f"{what} failed ({first_line(exc)}); retrying for up to {budget_s:.0f} s")
            time.sleep(min(delay, left))
            delay, attempt = delay * 2, attempt + 1
