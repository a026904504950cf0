"""scripts/bench_fidelity.py: its rank statistic and its CPU smoke run."""

import importlib.util
import json
import math
from pathlib import Path

import sys

import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "bench_fidelity.py"
_spec = importlib.util.spec_from_file_location("bench_fidelity", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_fidelity"] = bench  # dataclasses look their module up by name
_spec.loader.exec_module(bench)


def test_kendall_tau_b_on_known_rankings():
    """+1 for the same order, -1 reversed, tau-b's tie correction (1/sqrt(2*... )) checked by hand,
    and a diverged run (inf) ranks worst. A wrong sign would report fidelity where there is none."""
    assert bench.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert bench.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # pairs: (1,2) tie in x; (1,3) and (2,3) concordant -> (2 - 0) / sqrt((2 + 1) * 2)
    assert math.isclose(bench.kendall_tau([1, 1, 2], [1, 2, 3]), 2 / math.sqrt(6))
    assert bench.kendall_tau([0.01, math.inf, 0.0], [0.02, math.inf, -0.01]) == 1.0
    assert math.isnan(bench.kendall_tau([1, 1], [1, 2]))


@pytest.mark.slow
def test_smoke_run_writes_a_table_and_json(tmp_path, capsys):
    """The CPU smoke mode runs the whole pipeline: pre-tokenized corpus, short and 10x long runs
    against paired BF16 references, and a summary with tau and agreement."""
    assert bench.main(["--smoke", "--out", str(tmp_path), "--corpus-dir", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("*_bench_fidelity_smoke.json")).read_text())
    assert (tmp_path / "stdlib_bytes.npy").exists()
    assert report["meta"]["long_steps"] >= 10 * report["meta"]["short_steps"]
    assert report["summary"]["n_policies"] == len(report["rows"]) == 3
    assert 0.0 <= report["summary"]["agreement"] <= 1.0
    assert all({"gap", "stable", "diverged"} <= set(r["short"]) for r in report["rows"])
    assert "Kendall tau-b" in capsys.readouterr().out
