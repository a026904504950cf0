"""The hardware measurements tests hold the memory model to (``tests/measured/``, see its README)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MEASURED = Path(__file__).resolve().parent / "measured"


def measurement(name: str) -> dict[str, Any]:
    """The measurement file ``name`` of ``tests/measured/`` (``{"source", "meta"?, "rows"}``)."""
    return json.loads((MEASURED / name).read_text())
