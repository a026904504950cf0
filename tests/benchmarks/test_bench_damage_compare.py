"""benchmarks/bench_damage_compare.py on CPU at a toy size (seconds): the compares side by side, agreeing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_damage_compare  # noqa: E402


def test_the_bench_times_both_compares_and_they_agree(tmp_path, capsys):
    """Every memory preset has a whole, a chunked and a policy row (no eager one off CUDA); the chunked ones
    (chunks of 1000 of 5000 elements) hold fewer bytes at their peak and their Gram matrices equal the whole
    one's up to summation order; the policy's compare, given the BF16 families, holds less than the chunked."""
    out = tmp_path / "compare.json"
    argv = ["--sizes", "5000", "--repeats", "1", "--chunk", "1000", "--json", str(out)]
    assert bench_damage_compare.main(argv) == 0
    result = json.loads(out.read_text())
    rows = {(r["memory"], r["compare"]): r for r in result["rows"]}
    assert set(rows) == {(m, c) for m in bench_damage_compare.MEMORY for c in ("whole", "chunked", "policy")}
    for memory in bench_damage_compare.MEMORY:
        whole, chunked = rows[memory, "whole"], rows[memory, "chunked"]
        assert chunked["chunk"] == 1000 and whole["time_vs_whole"] == 1.0
        assert 0 < chunked["peak_bytes"] < whole["peak_bytes"]
        assert chunked["gram_difference"] < 1e-12 and chunked["seconds"] > 0
        policy = rows[memory, "policy"]
        assert policy["gram_difference"] < 1e-12 and 0 < policy["peak_bytes"] < chunked["peak_bytes"]
    assert result["meta"]["k"] == 4 and "chunked" in capsys.readouterr().out and out.with_suffix(".txt").exists()
