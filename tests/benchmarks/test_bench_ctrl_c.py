"""benchmarks/bench_ctrl_c.py on a CPU: one Ctrl-C of the smoke study, and the JSON the hazards page cites.

What would be wrong if this failed: the benchmark behind "Ctrl-C within a second" (docs/hazards.md, README)
no longer stops a run (no trial line, or a run that ignores SIGINT), or its JSON lost the latency, the exit
status or the lines printed after the signal. The latency itself is not asserted: targets live in the
benchmark's table, not in a timed test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_ctrl_c  # noqa: E402


def test_one_stop_of_the_smoke_study_is_recorded(tmp_path: Path):
    code = bench_ctrl_c.main(["--spaces", "search_spaces/cpu_smoke.yaml", "--workers", "1", "--repeats", "1",
                              "--timeout", "240", "--out", str(tmp_path), "--prefix", "t"])
    report = json.loads((tmp_path / "t_bench_ctrl_c.json").read_text())
    [row] = report["rows"]
    assert code == 0 and row["exits"] == [130]  # 130: ended by the interrupt, as the run documents
    assert row["workers"] == 1 and row["latencies_s"][0] == row["median_s"] > 0
    after = " ".join(row["runs"][0]["after"])
    assert "stopping:" in after and "Re-run the same command to resume" in after
