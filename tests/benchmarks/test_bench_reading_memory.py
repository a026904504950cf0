"""benchmarks/bench_reading_memory.py on a tiny Llama (CPU, ~15 s): both measurements, each in its own process."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_reading_memory  # noqa: E402

TINY = ["--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--vocab", "512",
        "--seq-len", "32", "--steps", "2", "--batches", "3", "--eval-batches", "2", "--tokens", "20000"]


def test_the_bench_measures_the_bf16_side_and_a_policys_reading(tmp_path, capsys):
    assert bench_reading_memory.main([*TINY, "--keep-states", "disk", "--out", str(tmp_path), "--label", "t"]) == 0
    (path,) = tmp_path.glob("*_cpu_bench_reading_memory_t.json")
    result = json.loads(path.read_text())
    meta, rows = result["meta"], result["rows"]
    assert meta["target_bytes"] == 3 * meta["model_bf16_bytes"] + meta["batch_bytes"]
    assert meta["model_bf16_bytes"] == 2 * meta["params"]
    bf16, policy = rows
    assert bf16["part"] == "bf16" and policy["part"] == "policy"
    for r in rows:
        assert r["bf16_peak_bytes"] > 0 and r["bf16_peak_bytes"] >= r["bf16_held_bytes"] - 2**20
        assert r["states_on"] == "disk"
        assert r["reader_host_bytes"] == 0 and r["reader_disk_bytes"] > 0
        assert set(r["bf16_held_split_bytes"]) == {"anon", "file"}
    assert "policy_peak_bytes" not in bf16
    assert policy["policy_peak_bytes"] >= policy["policy_own_peak_bytes"]
    assert math.isfinite(policy["reading"]["value"]) and policy["reading"]["value"] > 0
    out = capsys.readouterr().out
    assert "BF16 side: peak" in out and "policy reading: own part" in out and "x target" in out
