"""benchmarks/bench_memory.py on a CPU (``--smoke``, seconds): the rows its JSON promises, one per policy.

What would be wrong if this failed: the benchmark behind the memory model's full-depth error
(docs/results/memory.md) no longer runs, or its JSON lost the fields the page and
tests/probe/memory/test_memory.py read (predicted and measured GiB, the target depth, the policy).
On a CPU nothing is measured, so the test checks the code path and that the row says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_memory  # noqa: E402


def test_smoke_writes_one_row_per_policy_with_its_prediction(tmp_path: Path, capsys):
    assert bench_memory.main(["--smoke", "--out", str(tmp_path)]) == 0
    [written] = tmp_path.glob("*_bench_memory_smoke.json")
    report = json.loads(written.read_text())
    rows = report["rows"]
    assert len({r["policy"] for r in rows}) == len(rows) >= 7
    for row in rows:
        assert row["predicted_gib"] > 0 and row["target_layers"] == report["meta"]["target"]["n_layers"]
        assert "nothing measured" in row["source"]  # a CPU run must not pass a prediction off as a measurement
    assert report["meta"]["calib_layers"] == [1, 2]
    assert "max |error|" in capsys.readouterr().out
