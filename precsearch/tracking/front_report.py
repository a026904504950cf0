"""The Pareto front as files: a CSV and JSON table, a PNG plot and an HTML page.

The plot (:func:`front_figure`) shows every scored trial, each labelled with its
trial number, in four kinds (front, feasible, unstable, diverged), with the
stability limit drawn in the study's one unit (:mod:`precsearch.instability`): a
fraction of the BF16 loss (``relative``), BF16 seed spreads (``noise``, where each
trial's instability is divided by its reference's noise floor, as the verdict
does), or the fixed-state reading's measure (``damage``). The CSV and JSON give
it as ``instability_in_unit`` beside ``instability_unit`` (the unit's name) and
``instability_band``; ``instability`` stays the raw objective Optuna optimises.

``front.html`` holds the same plot (the PNG inline, with an image map: hovering
a point shows its trial, objectives and policy) and a table of every trial. It
has no script, so MLflow's artifact viewer renders it; the earlier plotly page
(4.7 MB of inline JavaScript) stayed blank there. The map reuses the PNG, so
the page costs no second rendering of the plot.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from precsearch.instability import INTERVAL_SE, Reading, StudyUnit, number
from precsearch.readings import own_unit_reading
from precsearch.recipes import STANDARD_FP8_NAME
from precsearch.tracking.experiment_view import VS_STANDARD

COLUMNS = ("trial", "fidelity_steps", "pareto", "feasible", "memory_saved", "instability", "instability_in_unit",
           "instability_unit", "instability_band", "loss_gap", "noise_floor", "gap_in_noise", "diverged", "policy")
"""front.csv's columns: what a trial's probes decide, so the same study writes the same file. The measured
speed (``tokens_per_s``, a clock's reading) joins them only as an objective (``objectives.throughput``)."""
STANDARD_COLUMNS = (VS_STANDARD, "instability_standard")
"""front.csv's columns where the study read the standard FP8 recipe (``objectives.damage.standard_reference``): each
trial's instability as a multiple of the standard's, and the standard's own reading at the trial's clip value."""
KINDS = {"Pareto front": ("tab:red", "*", 11), "feasible": ("tab:blue", "o", 6),
         "feasible, near the limit": ("tab:olive", "D", 6), "unstable": ("tab:orange", "X", 7),
         "diverged": ("black", "x", 7)}
"""Legend label: colour, marker, marker size."""


def rate_text(row: dict[str, Any]) -> str:
    """The row's tokens/s with its interval where it has one: ``44415 ± 96`` (± 2 SE, as the front compares them),
    else ``44415``."""
    half = INTERVAL_SE * row.get("tokens_per_s_se", math.nan)
    return f"{row['tokens_per_s']:.0f}" + (f" ± {half:.0f}" if math.isfinite(half) else "")


def write_front(rows: list[dict[str, Any]], directory: Path, stability_limit: float,
                unit: str = "relative", throughput: bool = False) -> list[Path]:
    """Write front.csv/.json (front rows) and front.png/.html (all trials); return the paths.

    front.csv has :data:`COLUMNS`, ``tokens_per_s`` and its standard error ``tokens_per_s_se`` when ``throughput``
    is an objective, and
    ``runs_as_is_in`` (the targets that run the trial's policy as it is) and ``target_memory_saved`` (what the
    study's target saves running it, predicted) where the rows have them; with ``throughput``, where the study
    predicted its framework target's speed-up, ``speedup_framework`` and the probe's ``speedup_probe``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    front = [r for r in rows if r["pareto"]]
    paths = [directory / f"front.{ext}" for ext in ("csv", "json", "png", "html")]
    with paths[0].open("w", newline="") as fh:
        columns = COLUMNS[:-2] + ("tokens_per_s", "tokens_per_s_se") + COLUMNS[-2:] if throughput else COLUMNS
        columns += tuple(c for c in ("runs_as_is_in", "target_memory_saved") if any(c in r for r in front))
        if throughput and any(math.isfinite(r.get("speedup_framework", math.nan)) for r in front):
            columns += ("speedup_framework", "speedup_probe")  # the target's speed-up, predicted; the probe's
        if beside_standard(front):  # the study read the standard FP8 recipe: its reading and each one's multiple
            columns += STANDARD_COLUMNS
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(front)
    paths[1].write_text(json.dumps([_finite(r) for r in front], indent=2, default=str))
    fig = front_figure(rows, stability_limit, unit)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    areas = _point_areas(fig, rows, unit, stability_limit)
    _close(fig)
    paths[2].write_bytes(png.getvalue())
    paths[3].write_text(front_html(rows, png.getvalue(), areas, stability_limit, unit))
    return paths


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf become null: strict JSON has no NaN."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def beside_standard(rows: list[dict[str, Any]]) -> bool:
    """Whether any row has a multiple of the standard FP8 recipe's reading (none: every output leaves it out)."""
    return any(isinstance(v := r.get(VS_STANDARD), (int, float)) and math.isfinite(v) for r in rows)


def _multiple_of(shown: Reading, limit: float) -> str:
    """A trial's multiple of the standard FP8 recipe's reading and that reading: ``1.3x of 0.0012``; ``-``."""
    return f"{shown.multiple} of {number(shown.standard, limit)}" if shown.multiple != "-" else "-"


def _standard_note(rows: list[dict[str, Any]], unit: str, limit: float) -> str:
    """The page's line on what the ``vs the standard FP8 recipe`` column is a multiple of."""
    what = next(reading(r, unit, limit).standard_recipe for r in rows if beside_standard([r]))
    return (f"<p>vs {html.escape(STANDARD_FP8_NAME)}: the trial's instability as a multiple of that recipe's reading "
            f"at the same states, batches and clip value ({html.escape(what)}).</p>")


def kind(row: dict[str, Any]) -> str:
    """Which of :data:`KINDS` a trial row is."""
    if row["pareto"]:
        return "Pareto front"
    if row["diverged"]:
        return "diverged"
    if not row["feasible"]:
        return "unstable"
    # within the limit, but its interval reaches past the stable band's edge: riskier than a stable trial
    return "feasible, near the limit" if row.get("instability_band") == "near the limit" else "feasible"


def reading(row: dict[str, Any], unit: str, limit: float = math.nan) -> Reading:
    """The trial's instability in the study's one unit (``unit``: ``relative``, ``noise`` or a reading's own)."""
    return StudyUnit.for_row(unit, limit, row).read(row)


def y_value(row: dict[str, Any], unit: str) -> float:
    """The trial's instability in ``unit``: a fraction of the BF16 loss, BF16 seed spreads, or the fixed-state
    reading's measure (NaN if unknown)."""
    return reading(row, unit).value


def damage_measure(rows: list[dict[str, Any]]) -> str:
    """The fixed-state reading's measure the trials were scored in (``update_norm``...), or "" if none says."""
    return next((r["damage_measure"] for r in rows if r.get("damage_measure")), "")


def y_label(unit: str, measure: str = "") -> str:
    """The y axis: the unit's name, a reading's measure alone (its description, 50 characters, overflowed the
    600 px figure; the HTML page and the terminal give it whole)."""
    return f"instability ({measure or StudyUnit(unit, math.nan, measure).name})"


def limit_label(limit: float, unit: str, measure: str = "") -> str:
    study = StudyUnit(unit, limit, measure)
    return f"stability limit {study.limit_text} {study.name}"


def front_figure(rows: list[dict[str, Any]], limit: float, unit: str = "relative"):
    """The trade-off plot: every trial as a labelled point, the limit as a dashed line. Close it after use.

    The y axis is linear (a symlog axis spaced 0-1 evenly and squeezed 1-2, which nobody reads right). A
    trial far above the rest (a diverged one) would flatten every other point to the floor, so the axis
    stops at :func:`_y_top` and such a trial is drawn as a triangle on the top edge, its value in its label.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 600 px wide: MLflow's artifact viewer, beside its Assistant panel, cut a wider front.html at the front's side
    fig, ax = plt.subplots(figsize=(6.0, 5.0), dpi=100)
    line = limit
    top = _y_top(rows, unit, line)
    seen: set[str] = set()
    points: dict[tuple[float, float], list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["trial"]):
        x, y = 100 * r["memory_saved"], y_value(r, unit)
        if not math.isfinite(y):
            continue
        label = kind(r)
        color, marker, size = KINDS[label]
        off = y > top
        ax.plot([x], [top if off else y], linestyle="none", marker="^" if off else marker, color=color,
                markersize=size, gid=f"trial-{r['trial']}", label=None if label in seen else label, clip_on=False)
        seen.add(label)
        points.setdefault((round(x, 6), round(top if off else y, 6)), []).append(r)
    measure = damage_measure(rows)
    study = StudyUnit(unit, limit, measure)  # a measure's short name: its description overflowed the legend
    ax.axhline(line, color="grey", linestyle="--", linewidth=1,
               label=f"stability limit {study.limit_text} {measure or study.name}")
    ax.set_ylim(-0.04 * top, top)
    ax.margins(x=0.08)
    ax.set_xlabel("memory saved vs BF16 (%)")
    ax.set_ylabel(y_label(unit, measure) + ", linear axis")
    ax.grid(alpha=0.3)
    _legend(ax, seen)
    off_scale = any(y_value(r, unit) > top for r in rows)
    own = own_unit_reading(unit)  # a reading read in its own measure names it; a loss gap is loss instability
    ax.set_title(f"memory saved vs {own.plot_subject if own else 'loss instability'}: {len(rows)} trials, "
                 f"{sum(1 for r in rows if r['pareto'])} on the front"
                 + ("\n▲ on the top edge: a trial above the axis, its value in its label" if off_scale else ""),
                 fontsize=10)
    fig.tight_layout()
    _label_points(ax, points, top, unit)
    return fig


def _legend(ax, kinds: set[str]) -> None:
    """The kinds drawn (each with its own marker, also when its first point sat on the top edge) and the limit,
    below the plot: beside it, the PNG was wider than MLflow's artifact viewer, which cut the legend off."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], linestyle="none", marker=m, color=c, markersize=s, label=k)
               for k, (c, m, s) in KINDS.items() if k in kinds]
    handles += [h for h in ax.get_legend_handles_labels()[0] if h.get_label().startswith("stability limit")]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14),
              ncol=min(3, len(handles)), frameon=False)


def _y_top(rows: list[dict[str, Any]], unit: str, line: float) -> float:
    """The top of the linear y axis: room for the limit and every trial within 5x of it, diverged ones aside."""
    values = [y for r in rows if not r["diverged"] and math.isfinite(y := y_value(r, unit)) and y <= 5 * line]
    return 1.12 * max([1.25 * line, *values])


def y_text(row: dict[str, Any], unit: str, limit: float = math.nan) -> str:
    """The trial's instability as the trial line gives it: ``1.98 BF16 seed spreads; limit 2: near the limit``."""
    return reading(row, unit, limit).text()


def _label_points(ax, points: dict[tuple[float, float], list[dict[str, Any]]], top: float, unit: str) -> None:
    """Label each point with its trial numbers (trials on one spot share a label), avoiding earlier labels;
    a point on the top edge stands for a value above the axis, which its label gives."""
    ax.figure.canvas.draw()  # fixes the limits, so display coordinates hold
    centres = {spot: ax.transData.transform(spot) for spot in points}
    taken = [(px - 6, py - 6, px + 6, py + 6) for px, py in centres.values()]  # the markers themselves
    frame = ax.get_window_extent()
    right, ceiling = ax.figure.bbox.x1 - 2, frame.y1 + 2  # a label past these is cut, or runs into the title

    def free(box: tuple[float, float, float, float]) -> bool:
        return (box[0] >= 0 and box[2] <= right and box[3] <= ceiling
                and not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken))

    for (x, y), members in points.items():
        text = ",".join(str(r["trial"]) for r in members)
        if y_value(members[0], unit) > top:
            text += f" ({reading(members[0], unit).number})"
        px, py = centres[(x, y)]
        width, height = 6.5 * len(text) + 2, 11
        for dx, dy in ((7, 4), (7, -15), (-7 - width, 4), (-7 - width, -15), (7, 16), (7, -27), (-7 - width, 16),
                       (-7 - width, -27)):
            box = (px + dx, py + dy, px + dx + width, py + dy + height)
            if free(box):
                break
        taken.append(box)
        ax.annotate(text, (x, y), xytext=(dx * 72 / ax.figure.dpi, dy * 72 / ax.figure.dpi),
                    textcoords="offset points", fontsize=8, color=KINDS[kind(members[0])][0],
                    annotation_clip=False)


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _point_areas(fig, rows: list[dict[str, Any]], unit: str, limit: float) -> list[tuple[int, int, str]]:
    """Each plotted trial's pixel position in the saved PNG and its hover text."""
    ax = fig.axes[0]
    height = fig.bbox.height
    areas = []
    for r in rows:
        y = y_value(r, unit)
        if not math.isfinite(y):
            continue
        px, py = ax.transData.transform((100 * r["memory_saved"], min(y, ax.get_ylim()[1])))
        text = (f"trial {r['trial']} ({kind(r)}): memory saved {100 * r['memory_saved']:.2f}%, "
                f"instability {y_text(r, unit, limit)}; {r['policy']}")
        areas.append((round(px), round(height - py), text))
    return areas


def front_html(rows: list[dict[str, Any]], png: bytes, areas: list[tuple[int, int, str]], limit: float,
               unit: str) -> str:
    """A script-free page: the plot (with hover text per point) and a table of every trial, best memory first."""
    # the instability column in the plot's unit: a table in % beside a plot in seed spreads did not match
    measure = damage_measure(rows)
    in_unit = StudyUnit(unit, limit, measure).name
    standard = beside_standard(rows)
    head = ("trial", "kind", "memory saved", f"instability ({in_unit})",
            *((f"vs {STANDARD_FP8_NAME}",) if standard else ()), "band", "loss gap vs BF16", "tokens/s", "steps",
            "policy")
    body = []
    for r in sorted(rows, key=lambda r: -r["memory_saved"]):
        gap = "diverged" if r["diverged"] else f"{100 * r['loss_gap']:+.2f}%"
        shown = reading(r, unit, limit)
        multiple = (_multiple_of(shown, limit),) if standard else ()
        cells = (r["trial"], kind(r), f"{100 * r['memory_saved']:.2f}%", shown.figure, *multiple, shown.band, gap,
                 rate_text(r), r["fidelity_steps"], r["policy"])
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    image = base64.b64encode(png).decode()
    spots = "".join(f'<area shape="circle" coords="{x},{y},7" title="{html.escape(t)}" alt="{html.escape(t)}">'
                    for x, y, t in areas)
    style = ("body{font-family:sans-serif;font-size:13px;margin:12px}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>precsearch front</title>"
            f"<style>{style}</style></head><body>"
            f"<p>Hover a point for its trial and policy. {html.escape(limit_label(limit, unit, measure))}.</p>"
            f"{_standard_note(rows, unit, limit) if standard else ''}"
            f"<img src='data:image/png;base64,{image}' usemap='#front' alt='the front plot'>"
            f"<map name='front'>{spots}</map>"
            f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{''.join(body)}</table></body></html>")
