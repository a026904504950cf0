"""benchmarks/bench_nonfinite.py on the CPU quickstart: both policies run with the check and without it, the
check is timed on every step it ran, and the report's speed-ups are each policy's over the BF16 reference."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_nonfinite  # noqa: E402


def test_the_check_is_timed_and_the_speedups_are_against_bf16(tmp_path, capsys):
    out = tmp_path / "nf.json"
    assert bench_nonfinite.main(["--steps", "3", "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    base, fp8 = report["rows"]
    assert base["policy"].startswith("BF16") and base["speedup_on"] == base["speedup_off"] == 1.0
    for r in (base, fp8):
        assert r["check_ms"] > 0 and 0 < r["check_share"] < 1 and r["tokens_per_s_off"] > 0
    assert fp8["speedup_on"] == fp8["tokens_per_s_on"] / base["tokens_per_s_on"]
    assert "x on / x off" in capsys.readouterr().out


def test_a_te_space_with_bf16_parameters_gets_the_memory_saving_state():
    from precsearch.config.loader import load_space

    space = load_space(bench_nonfinite.ROOT / "search_spaces" / "llama3_8b_h100_accelerate.yaml")
    base, fp8 = bench_nonfinite.policies(space).values()
    assert base.memory.master_weights and base.memory.moment_dtype == "fp32"
    assert fp8.memory.master_dtype == "remainders" and fp8.memory.moment_dtype == "fp8_block"
