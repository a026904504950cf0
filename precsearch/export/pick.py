"""Which trial to export: the pick rules (``--pick``), one registry read by the CLI and :func:`choose_trial`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from precsearch.errors import UserError


@dataclass(frozen=True)
class Pick:
    """One rule for choosing a trial.

    Attributes:
        key: Sort key of a trial row; the smallest wins (ties end on the trial number).
        verb: How the reason sentence says why the trial won ("saves the most memory").
    """

    key: Callable[[dict[str, Any]], tuple]
    verb: str


PICKS: dict[str, Pick] = {
    "max-memory": Pick(lambda r: (-r["memory_saved"], r["instability"], r["trial"]), "saves the most memory"),
    "fastest": Pick(lambda r: (-(r.get("tokens_per_s") or 0.0), -r["memory_saved"], r["trial"]), "is the fastest"),
    "most-stable": Pick(lambda r: (r["instability"], -r["memory_saved"], r["trial"]), "is the most stable"),
}
"""Pick name -> rule, in the order ``--pick`` lists them."""


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def instability_in(row: dict[str, Any], unit: str) -> float:
    """A trial row's instability in a space's ``stability_unit``: the relative loss gap (``relative``, a
    fraction as ``stability_limit`` is), or BF16 seed spreads (``noise``: over the reference's noise floor)."""
    if unit != "noise":  # relative, or damage (the fixed-state reading, in its own measure)
        return row["instability"]
    floor = row.get("noise_floor")
    return row["instability"] / floor if _finite(floor) and floor > 0 else math.nan


def unit_name(unit: str) -> str:
    """How a limit in ``unit`` reads after its number: ``<= 1.5 BF16 seed spreads``, ``<= 0.005 of the BF16 loss``."""
    return {"noise": "BF16 seed spreads", "damage": "(the fixed-state reading, in its measure)"}.get(
        unit, "of the BF16 loss")


def choose_trial(rows: list[dict[str, Any]], pick: str, max_instability: float | None = None,
                 unit: str = "relative") -> tuple[dict[str, Any], str]:
    """Pick one trial row by a rule; return it and a sentence saying why.

    Rows are :func:`precsearch.search.front.trial_rows` dicts. Only feasible,
    non-diverged trials are candidates, further limited to an instability of at
    most ``max_instability`` in ``unit`` (the study's ``stability_unit``, the unit
    of its ``stability_limit``: a study in seed spreads is limited in seed spreads)
    when that is given.

    * ``max-memory``: the most memory saved; ties go to the lower instability.
    * ``fastest``: the highest tokens/s among the Pareto front; ties go to more memory saved.
    * ``most-stable``: the lowest instability; ties go to more memory saved.

    Remaining ties go to the lower trial number, so the choice is deterministic.

    Raises:
        UserError: Unknown rule, a negative limit, or no trial qualifies (the message
            says what the closest trial has).
    """
    if pick not in PICKS:
        raise UserError(f"unknown rule {pick!r}; valid: {', '.join(PICKS)}", field="--pick")
    if max_instability is not None and not max_instability >= 0:
        raise UserError(f"must be >= 0, got {max_instability}", field="--max-instability")
    feasible = [r for r in rows if r.get("feasible") and not r.get("diverged")
                and _finite(r.get("instability")) and _finite(r.get("memory_saved"))]
    if not feasible:
        raise UserError(f"no feasible finished trial among {len(rows)} to pick from", field="--pick")
    pool = feasible if pick != "fastest" else [r for r in feasible if r.get("pareto")]
    where = "feasible trials" if pick != "fastest" else "trials on the Pareto front"
    if max_instability is not None:
        within = [r for r in pool if instability_in(r, unit) <= max_instability]
        if not within:
            best = min(pool, key=lambda r: instability_in(r, unit))
            raise UserError(
                f"none of the {len(pool)} {where} has instability <= {max_instability:g} {unit_name(unit)}; the "
                f"lowest is {instability_in(best, unit):.4g} (trial {best['trial']})", field="--max-instability")
        pool = within
        where += f" with instability <= {max_instability:g} {unit_name(unit)}"
    row = min(pool, key=PICKS[pick].key)
    facts = (f"memory saved {100 * row['memory_saved']:.2f}%, instability {instability_in(row, unit):.4g}"
             f"{' seed spreads' if unit == 'noise' else ''}, "
             f"{row.get('tokens_per_s') or 0:.0f} tokens/s")
    reason = f"trial {row['trial']} {PICKS[pick].verb} of {len(pool)} {where} ({facts})"
    return row, reason


__all__ = ["PICKS", "Pick", "choose_trial", "instability_in", "unit_name"]
