"""Pointing a local MLflow store at its output directory's new path after the directory was moved.

MLflow records absolute artifact locations (each experiment's and each run's) in its database.
After ``mv runs/a runs/b`` they still name ``runs/a``: new artifacts would be written there (the
old path re-created) and the UI could not find the old ones. For a sqlite store inside the moved
directory, :func:`relocate_artifacts` rewrites the locations under the old path to the new one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from precsearch.errors import UserError

_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"))


def relocate_artifacts(tracking_uri: str, old_dir: Path, new_dir: Path) -> int:
    """Rewrite artifact locations under ``old_dir`` to ``new_dir``; returns how many rows changed.

    Only for a ``sqlite:///`` store that lives in ``new_dir``; other stores are left alone (0).
    """
    db = Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None
    if db is None or Path(new_dir) not in db.parents or not db.is_file():
        return 0
    old, new = Path(old_dir).as_uri() + "/", Path(new_dir).as_uri() + "/"
    changed = 0
    try:
        with sqlite3.connect(db, timeout=60) as conn:
            for table, column in _COLUMNS:
                changed += conn.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, len(old), old)).rowcount
    except sqlite3.Error as exc:
        raise UserError(f"the directory moved from {old_dir}, and its MLflow store {db} could not be pointed at "
                        f"the new path ({exc}); new artifacts would go to the old one", field="tracking.uri") from None
    return changed
