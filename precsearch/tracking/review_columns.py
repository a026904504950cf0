"""What a trial's row and point look like in the MLflow UI: objectives in percent, a sort key, name and colour.

MLflow shows a metric as its raw float, cut to the column's width (``0.05030341…`` for a 5.03% saving),
and sorts the runs table by one key only. So each trial run also gets:

* ``memory_saved_pct``, and ``instability_in_unit`` (logged by :mod:`~precsearch.tracking.trial_record`): the
  instability in the study's one unit, named by the run's tag ``instability_unit``, as the terminal prints it
  (:mod:`precsearch.instability`); the table and charts show it. The per-unit copies of earlier versions,
  ``instability_pct`` (``relative``), ``instability_spreads`` (``noise``) and ``instability_sgd_noise`` (the
  fixed-state reading), are still logged: stored studies' views and scripts read them;
* ``tokens_per_s`` to the token and ``gap_in_noise`` to two decimals, as the terminal prints them (the
  study keeps the full values);
* ``feasible_first_memory_saved``: the runs table's default sort, feasible trials first, each part by
  memory saved (``memory_saved_pct``, plus 1000 for a feasible trial);
* the run name ``trial-<n> (front)`` while the trial is on the Pareto front, and a colour
  (the run tag ``mlflow.runColor``, read by MLflow 3.17's charts and table): front trials saturated,
  the others pale, hues spread by trial number so that no two near trials share one.
"""

from __future__ import annotations

import colorsys
import math

from precsearch.readings import own_unit_reading

MEMORY_PCT = "memory_saved_pct"
SORT_KEY = "feasible_first_memory_saved"
COLOR_TAG = "mlflow.runColor"
NAME_TAG = "mlflow.runName"
_GOLDEN = 0.618033988749895  # hue step: consecutive trials land far apart on the colour wheel


#: The instability column the table and charts show, whatever the unit (the run's tag ``instability_unit`` names it).
IN_UNIT = "instability_in_unit"


def instability_column(unit: str) -> str:
    """The display metric of instability the views show: :data:`IN_UNIT`, the study's one unit (any ``unit``)."""
    return IN_UNIT


def _legacy_column(unit: str) -> str:
    """The per-unit display metric of earlier versions, still logged."""
    own = own_unit_reading(unit)
    if own is not None:
        return own.legacy_column
    return "instability_spreads" if unit == "noise" else "instability_pct"


def review_metrics(metrics: dict[str, float], unit: str) -> dict[str, float]:
    """The display metrics of a trial's final ``metrics`` (needs ``memory_saved``, ``instability``, ``feasible``;
    ``noise_floor`` for a noise study); a value that cannot be computed is left out, not invented."""
    out: dict[str, float] = {}
    memory = metrics.get("memory_saved", math.nan)
    if math.isfinite(memory):
        out[MEMORY_PCT] = round(100 * memory, 2)
        out[SORT_KEY] = out[MEMORY_PCT] + (1000.0 if metrics.get("feasible") else 0.0)
    instability, floor = metrics.get("instability", math.nan), metrics.get("noise_floor", math.nan)
    if unit == "noise" and math.isfinite(instability) and math.isfinite(floor) and floor > 0:
        out[_legacy_column(unit)] = round(instability / floor, 2)
    elif own_unit_reading(unit) is not None and math.isfinite(instability):  # a reading's own measure
        out[_legacy_column(unit)] = own_unit_reading(unit).legacy_value(instability)
    elif unit != "noise" and math.isfinite(instability):
        out[_legacy_column(unit)] = round(100 * instability, 3)
    for name, digits in (("tokens_per_s", 0), ("gap_in_noise", 2)):
        if math.isfinite(value := metrics.get(name, math.nan)):
            out[name] = round(value, digits)
    return out


def run_name(number: int, on_front: bool) -> str:
    return f"trial-{number} (front)" if on_front else f"trial-{number}"


def run_colour(number: int, on_front: bool) -> str:
    """A ``#rrggbb`` colour for trial ``number``: saturated and dark on the front, pale off it."""
    hue = (number * _GOLDEN) % 1.0
    # off the front, three brightness levels: pale hue alone left twenty trials' colours too close to tell apart
    saturation, value = (0.9, 0.9) if on_front else (0.4, (0.95, 0.75, 0.85)[number % 3])
    r, g, b = colorsys.hsv_to_rgb(hue, saturation, value)
    return f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}"


def trial_look(number: int, on_front: bool) -> dict[str, str]:
    """The run tags that mark a trial's place on the front: ``pareto``, its name and its colour."""
    return {"pareto": "true" if on_front else "false", NAME_TAG: run_name(number, on_front),
            COLOR_TAG: run_colour(number, on_front)}
