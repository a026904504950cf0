"""Reading a JSON file that must hold one object (``config.json``, a dataset's ``state.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_json_object(path: Path, error: Callable[[Path, str], Exception]) -> dict[str, Any]:
    """The object in ``path``; ``error(path, message)`` is raised when it cannot be read or is not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise error(path, f"cannot read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error(path, "is not a JSON object")
    return data
