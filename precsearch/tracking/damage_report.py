"""A trial's fixed-state damage reading in MLflow: metrics per figure and per unit, and a table."""

from __future__ import annotations

import json
import math
from typing import Any

from precsearch.probe.result import ProbeResult


def _worst(damage: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in damage["states"] if s["step"] == damage["state_step"])


def damage_metrics(result: ProbeResult) -> dict[str, float]:
    """``damage.<figure>`` (every figure, at the worst state) and ``damage_unit.<unit>`` (the read figure)."""
    damage = result.damage
    if not damage:
        return {}
    worst = _worst(damage)
    metrics = {f"damage.{name}": value for name, (value, _) in worst["total"].items()}
    metrics |= {f"damage_unit.{unit}": figures[damage["measure"]][0] for unit, figures in worst["units"].items()
                if damage["measure"] in figures}
    return metrics | {"damage_state_step": float(damage["state_step"]), "damage_seconds": damage["seconds"]}


def damage_artifacts(result: ProbeResult) -> dict[str, str]:
    """``damage.json`` (the whole reading) and ``damage.md`` (the read figure per unit and state)."""
    damage = result.damage
    if not damage:
        return {}
    return {"damage.json": json.dumps(damage, indent=1), "damage.md": damage_table(damage)}


def _cell(pair: list[float]) -> str:
    value, se = pair
    return f"{value:.3g} ± {se:.2g}" if math.isfinite(se) else f"{value:.3g}"


#: What each figure is in, for the table's note (precsearch.probe.damage.reading has the formulas).
_MEANING = {
    "grad_noise": "the gradient error in units of the minibatch gradient noise at {tokens:,} tokens per step",
    "grad_bias_noise": "the gradient error's bias in units of the gradient noise at {tokens:,} tokens per step",
    "grad_var_noise": "the gradient error's variance in units of the gradient noise",
    "grad_norm": "the gradient error's bias squared, as a fraction of the mean gradient's squared norm",
    "update_noise": "the AdamW update's error in units of the update's batch noise at {tokens:,} tokens per step",
    "update_norm": "the AdamW update error's bias squared, as a fraction of the mean update's squared norm",
    "forward": "the relative held-out loss change at the state's weights",
}


def damage_table(damage: dict[str, Any]) -> str:
    """A markdown table: one row per unit (and the total), one column per state, of the read figure."""
    measure, states = damage["measure"], damage["states"]
    head = "| unit | " + " | ".join(f"step {s['step']}" for s in states) + " |"
    rows = [head, "|---" * (len(states) + 1) + "|",
            "| **total** | " + " | ".join(_cell(s["total"][measure]) for s in states) + " |"]
    for unit in states[0]["units"]:
        cells = [_cell(s["units"][unit][measure]) if measure in s["units"][unit] else "-" for s in states]
        rows.append(f"| {unit} | " + " | ".join(cells) + " |")
    note = (f"\n{measure}: {_MEANING[measure].format(tokens=damage['tokens_per_step'])} (± one jackknife standard "
            f"error over the batches); the reading is the worst state, step {damage['state_step']}: "
            f"{damage['value']:.3g}.\n")
    return f"# Fixed-state damage: {measure}\n\n" + "\n".join(rows) + "\n" + note
