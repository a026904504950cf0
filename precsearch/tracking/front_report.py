"""The Pareto front as files: a CSV and JSON table, a PNG plot and an interactive HTML plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

COLUMNS = ("trial", "fidelity_steps", "pareto", "feasible", "memory_saved", "instability", "loss_gap",
           "noise_floor", "gap_in_noise", "tokens_per_s", "diverged", "policy")


def write_front(rows: list[dict[str, Any]], directory: Path, stability_limit: float) -> list[Path]:
    """Write front.csv/.json (front rows) and front.png/.html (all trials); return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    front = [r for r in rows if r["pareto"]]
    paths = [directory / f"front.{ext}" for ext in ("csv", "json", "png", "html")]
    with paths[0].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(front)
    paths[1].write_text(json.dumps([_finite(r) for r in front], indent=2, default=str))
    _plot_png(rows, paths[2], stability_limit)
    _plot_html(rows, paths[3], stability_limit)
    return paths


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf become null: strict JSON has no NaN."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def _groups(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        "Pareto front": [r for r in rows if r["pareto"]],
        "feasible": [r for r in rows if r["feasible"] and not r["pareto"]],
        "unstable": [r for r in rows if not r["feasible"] and not r["diverged"]],
        "diverged": [r for r in rows if r["diverged"]],
    }


_STYLE = {"Pareto front": ("tab:red", "*"), "feasible": ("tab:blue", "o"),
          "unstable": ("tab:orange", "x"), "diverged": ("black", "X")}


def _plot_png(rows: list[dict[str, Any]], path: Path, limit: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, members in _groups(rows).items():
        if members:
            color, marker = _STYLE[label]
            ax.scatter([100 * r["memory_saved"] for r in members], [100 * r["instability"] for r in members],
                       c=color, marker=marker, s=60 if label == "Pareto front" else 30, label=label)
            for r in members if label == "Pareto front" else []:
                ax.annotate(str(r["trial"]), (100 * r["memory_saved"], 100 * r["instability"]), fontsize=7)
    ax.axhline(100 * limit, color="grey", linestyle="--", linewidth=1, label="stability limit")
    ax.set_xlabel("memory saved vs BF16 (%)")
    ax.set_ylabel("instability: loss gap vs BF16 (%)")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.legend(fontsize=8)
    ax.set_title("precsearch: memory saved vs loss instability")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_html(rows: list[dict[str, Any]], path: Path, limit: float) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    symbols = {"Pareto front": "star", "feasible": "circle", "unstable": "x", "diverged": "x-thin"}
    for label, members in _groups(rows).items():
        fig.add_trace(go.Scatter(
            x=[100 * r["memory_saved"] for r in members], y=[100 * r["instability"] for r in members],
            mode="markers", name=label, marker={"symbol": symbols[label], "size": 11},
            text=[f"trial {r['trial']}<br>{r['policy']}" for r in members],
            hovertemplate="%{text}<br>memory saved %{x:.2f}%<br>instability %{y:.3f}%<extra></extra>",
        ))
    fig.add_hline(y=100 * limit, line_dash="dash", annotation_text="stability limit")
    fig.update_layout(title="precsearch: memory saved vs loss instability",
                      xaxis_title="memory saved vs BF16 (%)", yaxis_title="instability (%)")
    path.write_text(fig.to_html(include_plotlyjs=True, full_html=True))
