"""Per-layer FP8 diagnostics of one trial, as MLflow metrics, tags and artifacts.

What a reviewer finds on a trial's run:

* metrics ``fp8_max_overflow`` / ``fp8_max_underflow`` (largest share over
  every FP8 layer, role and collected step), ``fp8_layers_saturating`` (layers
  with an operand whose overflow share passed the saturation limit at some
  collected step), ``fp8_nonfinite`` (non-finite values seen by the FP8 casts),
  ``fp8_max_input_crest`` (the largest amax / RMS of an FP8 layer's input: a few channels far above the rest,
  the massive activations of a trained model, which one per-tensor scale serves worst);
* tags ``fp8_max_overflow_at`` (layer, role and step of that maximum), ``fp8_max_input_crest_at`` (the
  layer and step of the largest crest) and
  ``first_bad`` (a diverged probe's first bad layer, tensor and step, or ``-``);
* artifacts ``diagnostics/layer_stats.csv`` (every collected row) and
  ``diagnostics/heatmap.png`` (layers x roles: overflow, underflow and amax;
  the first bad cell is outlined).

A trial with no FP8 layers, or whose FP8 never ran, gets no metrics, tags or
artifacts from here.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from precsearch.fp8.scaling import ROLES
from precsearch.probe.measure.diagnostics import DiagnosticsConfig, FirstBad
from precsearch.probe.result import ProbeResult
from precsearch.tracking.figures import png_bytes

COLUMNS = ("step", "layer", "role", "precision", "amax", "rms", "crest", "scale", "overflow", "underflow",
           "nonfinite")


def crest(row: dict[str, Any]) -> float:
    """A row's amax / RMS (NaN without a positive, finite RMS)."""
    rms = row.get("rms", math.nan)
    return row["amax"] / rms if isinstance(rms, float) and math.isfinite(rms) and rms > 0 else math.nan


def _largest_input_crest(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    inputs = [r for r in rows if r["role"] == "input" and math.isfinite(crest(r))]
    return max(inputs, key=crest) if inputs else None


def diagnostics_metrics(result: ProbeResult, limit: float = DiagnosticsConfig.saturation_limit) -> dict[str, float]:
    """Summary metrics over every collected row (empty without rows)."""
    rows = result.layer_stats
    if not rows:
        return {}
    return {
        "fp8_max_overflow": max(r["overflow"] for r in rows),
        "fp8_max_underflow": max(r["underflow"] for r in rows),
        "fp8_layers_saturating": float(len({r["layer"] for r in rows if r["overflow"] > limit})),
        "fp8_nonfinite": float(sum(r["nonfinite"] for r in rows)),
    } | ({"fp8_max_input_crest": crest(top)} if (top := _largest_input_crest(rows)) is not None else {})


def diagnostics_tags(result: ProbeResult) -> dict[str, str]:
    """Where the largest overflow was, and the first bad layer of a diverged probe."""
    tags = {}
    if result.layer_stats:
        worst = max(result.layer_stats, key=lambda r: r["overflow"])
        tags["fp8_max_overflow_at"] = f"{worst['layer']} {worst['role']} step {worst['step']}"
        if (top := _largest_input_crest(result.layer_stats)) is not None:
            tags["fp8_max_input_crest_at"] = f"{top['layer']} step {top['step']}"
    if result.first_bad is not None:
        tags["first_bad"] = FirstBad(**result.first_bad).describe()
    elif result.layer_stats:
        tags["first_bad"] = "-"
    return tags


def diagnostics_artifacts(result: ProbeResult) -> dict[str, str]:
    """Text artifacts: the per-layer table as CSV (empty without rows)."""
    if not result.layer_stats:
        return {}
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(dict(r, crest=crest(r)) for r in result.layer_stats)
    return {"diagnostics/layer_stats.csv": out.getvalue()}


def _grid(rows: list[dict[str, Any]], layers: list[str], field: str) -> list[list[float]]:
    """layers x roles of ``field``: the max over collected steps (NaN where never collected)."""
    grid = [[math.nan] * len(ROLES) for _ in layers]
    index = {name: i for i, name in enumerate(layers)}
    for r in rows:
        i, j = index[r["layer"]], ROLES.index(r["role"])
        value = r[field]
        grid[i][j] = value if math.isnan(grid[i][j]) else max(grid[i][j], value)
    return grid


def diagnostics_heatmap(result: ProbeResult) -> bytes | None:
    """A PNG heatmap of layers x tensor roles (overflow, underflow, log10 amax), or None without rows."""
    rows = result.layer_stats
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = list(dict.fromkeys(r["layer"] for r in rows))
    panels = (("overflow", "overflow share (max over steps)", "Reds", lambda v: v),
              ("underflow", "underflow share (max over steps)", "Blues", lambda v: v),
              ("amax", "log10 amax (max over steps)", "viridis", lambda v: math.log10(v) if v > 0 else math.nan))
    fig, axes = plt.subplots(1, 3, figsize=(12, 1.5 + 0.28 * len(layers)), dpi=110, sharey=True)
    for ax, (field, title, cmap, transform) in zip(axes, panels):
        grid = [[transform(v) for v in row] for row in _grid(rows, layers, field)]
        image = ax.imshow(grid, aspect="auto", cmap=cmap, interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.08)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(ROLES)), ROLES, fontsize=8)
        _outline_first_bad(ax, result.first_bad, layers)
    axes[0].set_yticks(range(len(layers)), layers, fontsize=7)
    fig.suptitle(_heading(result), fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def _outline_first_bad(ax: Any, first_bad: dict[str, Any] | None, layers: list[str]) -> None:
    if first_bad is None or first_bad["layer"] not in layers or first_bad["tensor"] not in ROLES:
        return
    from matplotlib.patches import Rectangle

    y, x = layers.index(first_bad["layer"]), ROLES.index(first_bad["tensor"])
    ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))


def _heading(result: ProbeResult) -> str:
    steps = sorted({r["step"] for r in result.layer_stats})
    heading = f"FP8 statistics per layer, collected at steps {', '.join(map(str, steps))}"
    if result.first_bad is not None:
        heading += f"\n{FirstBad(**result.first_bad).describe()}"
    return heading
