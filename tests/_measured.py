"""The hardware measurements tests hold the memory model to (``tests/measured/``, see its README).

A test reads them when it runs, never at import: on a tree without a file the test that needs it is
skipped (saying which file), and the rest of the suite still collects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

MEASURED = Path(__file__).resolve().parent / "measured"


def measured_path(name: str) -> Path:
    """The path of measurement file ``name``; skips the calling test when the file is absent."""
    path = MEASURED / name
    if not path.is_file():
        pytest.skip(f"no measurement file tests/measured/{name} in this tree")
    return path


def measurement(name: str) -> dict[str, Any]:
    """The measurement file ``name`` of ``tests/measured/`` (``{"source", "meta"?, "rows"}``); skips when absent."""
    return json.loads(measured_path(name).read_text())


def measured_rows(name: str) -> list[dict[str, Any]]:
    """The rows of ``name`` for a ``parametrize`` list, read at collection: ``[]`` (a skipped test) when absent."""
    path = MEASURED / name
    return json.loads(path.read_text())["rows"] if path.is_file() else []
