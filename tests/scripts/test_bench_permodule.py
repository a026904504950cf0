"""The per-module benchmark's pieces: the shuffled control keeps what it must, HV curves count the pass."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_permodule as bench  # noqa: E402
from precsearch.search.sensitivity import SensitivityTable, UnitEffect  # noqa: E402


def _table() -> SensitivityTable:
    rows = [UnitEffect(f"u{i}", f"precision.u{i}", p, 0.0 if p == "bf16" else 0.001 * (i + 1), 0.0,
                       0.0 if p == "bf16" else 0.01 * (i + 1), 0.0) for i in range(6) for p in ("bf16", "fp8_current")]
    return SensitivityTable("forward", rows, 0.0)


def test_the_control_shuffles_only_the_low_precision_scores():
    """Memory and the BF16 rows must stay put, or the control would test something else than the ranking."""
    table = _table()
    control = bench.shuffled(table, seed=3)
    assert [(r.param, r.precision, r.memory_saved) for r in control.rows] == \
           [(r.param, r.precision, r.memory_saved) for r in table.rows]
    assert all(r.predicted_instability == 0 for r in control.rows if r.precision == "bf16")
    low = lambda t: [r.predicted_instability for r in t.rows if r.precision != "bf16"]  # noqa: E731
    assert Counter(low(control)) == Counter(low(table)) and low(control) != low(table)


def test_hv_curve_counts_the_up_front_cost_and_ignores_infeasible_rows():
    rows = {"a": {"feasible": True, "memory_saved": 0.5, "instability": 0.0},
            "b": {"feasible": False, "memory_saved": 0.9, "instability": 0.5},
            "c": {"feasible": True, "memory_saved": 1.0, "instability": 0.0}}
    ref = (0.0, 0.01)
    curve = bench.hv_curve(["a", "b", "c"], rows, ref, best=0.01, offset=2)
    assert curve[:2] == [0.0, 0.0] and len(curve) == 5
    assert curve[2] == curve[3] == 0.5 and curve[4] == 1.0
    assert bench.probes_to(curve, 0.95) == 5 and bench.probes_to(curve, 2.0) is None
