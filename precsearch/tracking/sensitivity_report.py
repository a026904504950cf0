"""The sensitivity table as MLflow artifacts: JSON, CSV, and a block x unit heatmap per precision."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from typing import Any

from precsearch.tracking.figures import png_bytes

_KINDS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "output_layer")
_BLOCK = re.compile(r"decoder\.layers\.(\d+)\.")


def table_csv(rows: list[dict[str, Any]]) -> str:
    """One line per unit x precision."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["unit"])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _grid(rows: list[dict[str, Any]], precision: str) -> tuple[list[str], list[list[float]]]:
    """Block labels and a block x kind grid of predicted instability (NaN where a unit is not searched)."""
    cells: dict[tuple[str, str], float] = {}
    for r in rows:
        if r["precision"] != precision:
            continue
        m = _BLOCK.match(r["unit"])
        block = f"block {m.group(1)}" if m else "head"
        cells[block, r["unit"].rsplit(".", 1)[-1]] = r["predicted_instability"]
    blocks = sorted({b for b, _ in cells}, key=lambda b: (b == "head", int(b.split()[-1]) if b != "head" else 0))
    return blocks, [[cells.get((b, k), math.nan) for k in _KINDS] for b in blocks]


def heatmap(rows: list[dict[str, Any]], estimator: str) -> bytes | None:
    """PNG: for each low precision, predicted instability per block (rows) x unit kind (columns)."""
    precisions = sorted({r["precision"] for r in rows} - {"bf16"})
    if not precisions:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_blocks = len(_grid(rows, precisions[0])[0])
    fig, axes = plt.subplots(1, len(precisions), figsize=(4.5 * len(precisions), 1.6 + 0.3 * n_blocks), dpi=110,
                             squeeze=False)
    for ax, p in zip(axes[0], precisions):
        blocks, grid = _grid(rows, p)
        image = ax.imshow(grid, aspect="auto", cmap="magma_r", interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.08)
        ax.set_title(f"{p}: predicted instability", fontsize=9)
        ax.set_xticks(range(len(_KINDS)), [k.replace("linear_", "") for k in _KINDS], fontsize=8)
        ax.set_yticks(range(len(blocks)), blocks, fontsize=7)
    fig.suptitle(f"one unit switched, estimator '{estimator}'", fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def sensitivity_artifacts(table: dict[str, Any]) -> dict[str, bytes]:
    """Artifact name -> bytes for the parent run: ``sensitivity/table.{json,csv}``, ``sensitivity/heatmap.png``."""
    files = {"sensitivity/table.json": json.dumps(table, indent=1).encode(),
             "sensitivity/table.csv": table_csv(table["rows"]).encode()}
    png = heatmap(table["rows"], table["estimator"])
    return files | ({"sensitivity/heatmap.png": png} if png else {})
