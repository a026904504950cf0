"""User-facing errors.

A :class:`UserError` is a mistake in what the user gave us (a space file, a
policy file, a path, a URI). The CLI prints its message and exits with status 2,
without a traceback. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re


class UserError(Exception):
    """Bad input: names where (file, field) and what would be valid."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        # one line whatever the message quotes: a library's multi-line error (a tokenizer's) must not
        # split the CLI's one-line refusal
        self.detail = re.sub(r"\s*[\r\n]+\s*", " ", message).strip()
        super().__init__(self._format())

    def _format(self) -> str:
        where = ": ".join(p for p in (self.file, self.field) if p)
        return f"{where}: {self.detail}" if where else self.detail

    def located(self, *, file: str | None = None, field: str | None = None) -> "UserError":
        """A copy that also names the file and/or field (keeps any already set)."""
        return UserError(self.detail, file=self.file or file, field=self.field or field)


class UserErrors(UserError):
    """Several problems found at once (every bad field of one file): one line each, the first as a
    :class:`UserError` would show it, the others indented under it. ``file``, ``field`` and ``detail``
    are the first problem's."""

    def __init__(self, problems: list[UserError]):
        self.problems = list(problems)
        first = self.problems[0]
        super().__init__(first.detail, file=first.file, field=first.field)

    def _format(self) -> str:
        return "\n  ".join(UserError._format(p) for p in self.problems)

    def located(self, *, file: str | None = None, field: str | None = None) -> "UserErrors":
        return UserErrors([p.located(file=file, field=field) for p in self.problems])


class DataError(UserError):
    """A data source cannot be read (missing file, bad dtype, too few tokens)."""
