"""What a study name may be: what the filesystem and MLflow refuse, nothing more.

A study name becomes one folder (``precsearch-runs/<name>``), an Optuna study name, an MLflow
experiment name and a tag value that precsearch finds again with a search filter
(``tags.`precsearch.study` = '<name>'``). Those refuse, and so does this module:

* a path separator (``/``, and ``\\`` which is one on Windows), NUL, or the names ``.`` and ``..``:
  the name would not be one folder;
* more than 255 bytes in UTF-8: a POSIX file name's limit (``NAME_MAX``) is in bytes, so a name in a
  non-Latin script reaches it in fewer characters (3 bytes each for CJK);
* a single quote: MLflow's filter strings quote values in single quotes and strip the quotes without
  un-escaping anything, so no quote can be written inside one (checked against MLflow 3: the
  filter fails to parse);
* control characters (newline, tab, ...): a folder named with a newline cannot be typed back and
  would break every one-line message that names it.

Letters of any script, digits, spaces and punctuation other than those are accepted: ``研究`` is a
valid study name.
"""

from __future__ import annotations

import unicodedata

#: POSIX NAME_MAX, in bytes of the UTF-8 encoding (ext4, XFS, btrfs, APFS all use 255).
MAX_NAME_BYTES = 255


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a study (one sentence naming what is refused), or None if it can."""
    if not name:
        return "is empty; e.g. my-study"
    if name in (".", ".."):
        return "is '.' or '..', which name folders already there (this one and its parent)"
    for char, why in (("/", "a path separator"), ("\\", "a path separator on Windows"), ("\0", "NUL"),
                      ("'", "a single quote, which MLflow search filters cannot carry")):
        if char in name:
            return f"contains {why}"
    control = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if control is not None:
        return f"contains the control character {control!r}, which no folder listing or message shows"
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes in UTF-8; a folder name holds at most {MAX_NAME_BYTES}"
    return None


#: What :func:`name_problem` refuses, for messages.
REFUSED = ("'/', '\\', NUL, a single quote, control characters, '.' or '..', "
           f"or more than {MAX_NAME_BYTES} bytes")
