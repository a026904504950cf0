"""scripts/bench_probe.py: the BEFORE and AFTER studies of ``--compare`` differ only where they should."""

import importlib.util
import sys
from pathlib import Path

import torch

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "bench_probe.py"
_spec = importlib.util.spec_from_file_location("bench_probe", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_probe"] = bench
_spec.loader.exec_module(bench)


def test_before_records_inline_and_after_runs_the_defaults(monkeypatch):
    """An AFTER that inherited PRECSEARCH_SYNC_RECORD (or a BEFORE without it) would compare a path with itself."""
    monkeypatch.setenv("PRECSEARCH_SYNC_RECORD", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    after = bench.variant_env("after", torch.device("cpu"))
    before = bench.variant_env("before", torch.device("cpu"))
    assert "PRECSEARCH_SYNC_RECORD" not in after and "PRECSEARCH_CPU_THREADS" not in after
    assert before["PRECSEARCH_SYNC_RECORD"] == "1"
    assert before["PRECSEARCH_CPU_THREADS"] == str(len(__import__("os").sched_getaffinity(0)))  # torch's default
    assert "PRECSEARCH_CPU_THREADS" not in bench.variant_env("before", torch.device("cuda"))
