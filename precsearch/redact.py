"""Hiding passwords in URLs and text before they are printed or logged.

Storage and tracking URLs may carry credentials
(``postgresql://user:secret@host/db``, ``https://host/?token=...``). The
manifest that reopens a study keeps the real URL (it is a local file and the
URL is needed), but everything shown to a person or sent to MLflow goes
through :func:`redact_text` (or :func:`redact_url` for one URL): the password
becomes ``***``, the user name and host stay, so the message still says which
store it is about.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://user:password@host -- the password runs to the last '@' of the token, so a password with
# an unescaped '@' or '/' is hidden whole (hiding a little too much beats leaking the rest).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)(?P<secret>[^\s'\"]*)(?P<at>@)")

# ?password=...  &token=...  ;pwd=...  (query strings and SQLAlchemy/ODBC-style options)
_SECRET_PARAM = re.compile(
    r"(?P<head>[?&;](?:password|passwd|pwd|secret|token|access_token|api_key|apikey|auth)=)(?P<secret>[^&;#\s'\"]*)",
    re.IGNORECASE,
)


def redact_url(url: str) -> str:
    """``url`` with its password (user-info or a secret query parameter) replaced by ``***``.

    Args:
        url: Any URL or Optuna/SQLAlchemy/MLflow store string; one without a password is returned unchanged.

    Returns:
        The same string, credentials masked.
    """
    return redact_text(url)


def redact_text(text: str) -> str:
    """``text`` (a YAML file, a log line, an error message) with every URL password replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}{m['at']}" if m["secret"] else m[0], text)
    return _SECRET_PARAM.sub(lambda m: f"{m['head']}{MASK}" if m["secret"] else m[0], text)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (at most 300 characters), redacted; its type name if it has none."""
    lines = str(exc).strip().splitlines()
    return redact_text(lines[0][:300] if lines else type(exc).__name__)
