"""scripts/bench_gram.py on CPU at a toy size (seconds): both Gram products side by side, agreeing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_gram  # noqa: E402
from precsearch.probe.damage import gram  # noqa: E402


def test_the_bench_times_the_gram_both_ways_and_they_agree(tmp_path, capsys, monkeypatch):
    """A Gram row per block size and a unit row, each timed both ways; the matrices agree to summation order;
    the unit's segmented side really ran the alternative inside the compare step (the patch is gone afterwards)."""
    calls = []
    alternative = bench_gram.segmented
    monkeypatch.setattr(bench_gram, "segmented", lambda *a: calls.append(1) or alternative(*a))
    out = tmp_path / "gram.json"
    assert bench_gram.main(["--device", "cpu", "--sizes", "100000", "--rows", "8", "--unit", "300000",
                            "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["part"], r["rows"], r["elements"]) for r in result["rows"]] == [("gram", 8, 100000),
                                                                              ("unit", 8, 300000)]
    for r in result["rows"]:
        assert set(r["seconds"]) == {"one GEMM", "segments"} and min(r["seconds"].values()) > 0
        assert r["difference"] < 1e-12
    # the Gram row (warm-up + 1) and the unit's compare (warm-up + 1; 2 chunks of 2**18 a pass) went through it
    assert len(calls) == 2 + 2 * 2 and gram.gram_of_stacked.__module__ == gram.__name__
    assert result["meta"]["segment"] == bench_gram.SEGMENT and "segments" in capsys.readouterr().out
    assert out.with_suffix(".txt").exists()
