"""Matplotlib figures as PNG bytes, the form the reports log to MLflow."""

from __future__ import annotations

import io
from typing import Any


def png_bytes(fig: Any) -> bytes:
    """``fig`` rendered as PNG; the figure is closed (pyplot keeps open figures alive)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
