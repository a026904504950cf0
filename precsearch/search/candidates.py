"""Candidate policies from a sensitivity table: one integer program per memory budget.

Each searched unit u takes exactly one of its precisions p (binary x[u, p],
``sum_p x[u, p] = 1``). For a budget B the program is

    minimise   sum s[u, p] x[u, p]  -  eps * sum m[u, p] x[u, p]
    subject to sum m[u, p] x[u, p] >= B

with s the predicted instability (a non-finite one excludes that choice: its
x is bounded to 0) and m the resource each unit x precision
saves (:mod:`precsearch.search.sensitivity`): memory saved, or the predicted
GEMM-time saved (``search.sensitivity.budget_on``); the small ``eps`` term breaks
ties toward saving more. Budgets sweep evenly up to the most the units can save;
equal assignments are kept once. Solved with
``scipy.optimize.milp`` (HiGHS branch and bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from precsearch.search.sensitivity import SensitivityTable, UnitEffect


@dataclass(frozen=True)
class Candidate:
    """One assignment: unit param -> precision name, with its predicted totals and the budget it met."""

    params: dict[str, str]
    predicted_instability: float
    predicted_memory_saved: float
    predicted_speed_gain: float
    budget: float


def _by_param(table: SensitivityTable) -> dict[str, list[UnitEffect]]:
    out: dict[str, list[UnitEffect]] = {}
    for row in table.rows:
        out.setdefault(row.param, []).append(row)
    return out


RESOURCES = {"memory": "memory_saved", "speed": "speed_gain"}


def solve(table: SensitivityTable, budget: float, on: str = "memory") -> Candidate | None:
    """The assignment with the least predicted instability saving at least ``budget`` of ``on``
    (``memory`` or ``speed``); None if no assignment saves that much."""
    units = _by_param(table)
    rows = [r for effects in units.values() for r in effects]
    s = np.array([r.predicted_instability for r in rows])
    m = np.array([getattr(r, RESOURCES[on]) for r in rows])
    # a switch whose scored loss was non-finite (the forward estimator's inf) is never chosen
    allowed = np.isfinite(s)
    s = np.where(allowed, s, 0.0)
    scale = max(float(s.max()), 1e-12)
    c = s / scale - 1e-6 * m / max(float(m.max()), 1e-12)
    one_each = np.zeros((len(units), len(rows)))
    col = 0
    for i, effects in enumerate(units.values()):
        one_each[i, col:col + len(effects)] = 1.0
        col += len(effects)
    constraints = [LinearConstraint(one_each, 1.0, 1.0), LinearConstraint(m[None, :], budget, np.inf)]
    res = milp(c, integrality=np.ones(len(rows)), bounds=Bounds(0, allowed.astype(float)), constraints=constraints)
    if res.x is None:
        return None
    chosen = [r for r, x in zip(rows, res.x) if x > 0.5]
    return Candidate({r.param: r.precision for r in chosen}, sum(r.predicted_instability for r in chosen),
                     sum(r.memory_saved for r in chosen), sum(r.speed_gain for r in chosen), budget)


def sweep(table: SensitivityTable, budgets: int, on: str = "memory") -> list[Candidate]:
    """Distinct candidates for ``budgets`` budgets from 1/budgets to all of what the units can save of ``on``."""
    field = RESOURCES[on]
    most = sum(max(getattr(r, field) for r in effects) for effects in _by_param(table).values())
    out: list[Candidate] = []
    seen: set[tuple] = set()
    for k in range(budgets, 0, -1):  # most saving first: the front's far end is probed first
        cand = solve(table, most * k / budgets * (1 - 1e-9), on)
        key = tuple(sorted(cand.params.items())) if cand else None
        if cand is not None and key not in seen:
            seen.add(key)
            out.append(cand)
    return out
