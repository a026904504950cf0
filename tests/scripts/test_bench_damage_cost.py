"""scripts/bench_damage_cost.py on CPU (the smoke space, ~10 s): one reader per keep_states value, side by side."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_damage_cost  # noqa: E402


def test_the_bench_reads_every_policy_with_each_keep_states_value(tmp_path, capsys):
    """The single-reader keys hold the first value's figures (old consumers read them); each value has its
    reading time, share and value, equal readings; the BF16 side's device peak is None off CUDA."""
    argv = [str(ROOT / "search_spaces/cpu_smoke.yaml"), "--out", str(tmp_path), "--keep-states", "host", "device"]
    assert bench_damage_cost.main(argv) == 0
    (path,) = tmp_path.glob("*_bench_damage_cost_cpu_smoke.json")
    result = json.loads(path.read_text())
    meta, rows = result["meta"], result["rows"]
    assert meta["keep_states"] == ["host", "device"]
    assert set(meta["bf16_side_s_by_keep"]) == {"host", "device"}
    assert meta["bf16_side_s"] == meta["bf16_side_s_by_keep"]["host"]
    assert meta["bf16_max_allocated_bytes_by_keep"] == {"host": None, "device": None}
    for r in rows:
        assert r["reading_s"] == r["reading_s_by_keep"]["host"] and r["share"] == r["share_by_keep"]["host"]
        assert set(r["share_by_keep"]) == {"host", "device"}
        assert r["value_by_keep"]["host"] == r["value_by_keep"]["device"] == r["value"]
    out = capsys.readouterr().out
    assert "read s (host)" in out and "read s (device)" in out and "share (device)" in out


def test_compile_compare_values_are_readers_of_their_own_with_equal_readings(tmp_path, capsys):
    """``--compile-compare on off`` gives a reader per value (on a CPU both compare op by op: equal readings),
    each with its first reading timed apart."""
    argv = [str(ROOT / "search_spaces/cpu_smoke.yaml"), "--out", str(tmp_path), "--compile-compare", "on", "off"]
    assert bench_damage_cost.main(argv) == 0
    (path,) = tmp_path.glob("*_bench_damage_cost_cpu_smoke.json")
    result = json.loads(path.read_text())
    meta = result["meta"]
    assert meta["keep_states"] == ["host/on", "host/off"]
    assert meta["readers"] == {"host/on": {"keep_states": "host", "compile_compare": True},
                               "host/off": {"keep_states": "host", "compile_compare": False}}
    assert set(meta["first_read_s_by_keep"]) == {"host/on", "host/off"}
    assert all(s > 0 for s in meta["first_read_s_by_keep"].values())
    for r in result["rows"]:
        assert r["value_by_keep"]["host/on"] == r["value_by_keep"]["host/off"]
    assert "read s (host/off)" in capsys.readouterr().out
