"""The integer program: optimal against brute force, budgets honoured, one precision per unit, no repeats."""

from __future__ import annotations

import itertools
import random

import pytest

from precsearch.search.candidates import solve, sweep
from precsearch.search.sensitivity import SensitivityTable, UnitEffect

PRECISIONS = ("bf16", "fp8_current", "fp8_block")


def _table(seed: int, n_units: int = 5) -> SensitivityTable:
    rng = random.Random(seed)
    rows = []
    for u in range(n_units):
        for p in PRECISIONS:
            bf16 = p == "bf16"
            rows.append(UnitEffect(unit=f"u{u}", param=f"precision.u{u}", precision=p,
                                   predicted_instability=0.0 if bf16 else rng.random() * 1e-3, raw_score=0.0,
                                   memory_saved=0.0 if bf16 else rng.random() * 0.05, speed_gain=0.0))
    return SensitivityTable("forward", rows, 0.0)


def _brute_force(table: SensitivityTable, budget: float) -> float | None:
    """Least total predicted instability over every assignment saving >= budget."""
    by_unit: dict[str, list[UnitEffect]] = {}
    for r in table.rows:
        by_unit.setdefault(r.param, []).append(r)
    best = None
    for combo in itertools.product(*by_unit.values()):
        if sum(r.memory_saved for r in combo) >= budget:
            cost = sum(r.predicted_instability for r in combo)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_program_finds_the_brute_force_optimum_for_every_budget(seed):
    """243 assignments enumerated; the MILP's pick must be as good (a worse one means a wrong model)."""
    table = _table(seed)
    most = sum(max(r.memory_saved for r in table.rows if r.param == p) for p in {r.param for r in table.rows})
    for frac in (0.1, 0.35, 0.6, 0.85, 0.999):
        cand = solve(table, frac * most)
        assert cand is not None
        assert set(cand.params) == {r.param for r in table.rows}  # exactly one precision per unit
        assert cand.predicted_memory_saved >= frac * most - 1e-12
        assert cand.predicted_instability == pytest.approx(_brute_force(table, frac * most), abs=1e-9)


def test_an_unreachable_budget_gives_none():
    assert solve(_table(0), 10.0) is None


def test_sweep_is_distinct_and_runs_from_most_saving_down():
    cands = sweep(_table(1), 8)
    keys = [tuple(sorted(c.params.items())) for c in cands]
    assert len(keys) == len(set(keys)) >= 3
    saved = [c.predicted_memory_saved for c in cands]
    assert saved == sorted(saved, reverse=True)
    assert all(v != "bf16" for v in cands[0].params.values())  # the largest budget needs every unit switched


def test_a_switch_scored_non_finite_is_never_chosen():
    """The forward estimator scores a switch whose loss went non-finite as inf: the program must exclude it,
    not fail on an infinite cost."""
    import dataclasses
    import math

    table = _table(0)
    banned = ("precision.u0", "fp8_current")
    rows = [dataclasses.replace(r, predicted_instability=math.inf) if (r.param, r.precision) == banned else r
            for r in table.rows]
    table = SensitivityTable("forward", rows, 0.0)
    cands = sweep(table, 6)
    assert cands and all(c.params["precision.u0"] != "fp8_current" for c in cands)
    assert all(math.isfinite(c.predicted_instability) for c in cands)
