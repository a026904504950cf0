"""benchmarks/bench_emulated_gemm.py on a CPU: both GEMM modes train the same model to the same losses.

What would be wrong if this failed: the bench that times the GPU's BF16-code GEMMs against float32 could compare
two different models or steps, or report a speed-up without the two modes' losses beside it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_emulated_gemm  # noqa: E402
from precsearch.backends import emulated  # noqa: E402


def test_smoke_reports_both_modes_with_matching_losses(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated, "CODE_GEMMS", emulated.CODE_GEMMS)  # the bench sets it; restore after
    out = tmp_path / "r.json"
    bench_emulated_gemm.main(["--smoke", "--steps", "2", "--warmup", "1", "--recipes", "fp8_current", "nvfp4",
                              "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"bf16", "fp8_current", "nvfp4"}
    for recipe in ("fp8_current", "nvfp4"):
        row = rows[recipe]
        assert len(row["float32"]["losses"]) == len(row["codes"]["losses"]) == 3
        assert row["speedup"] > 0 and row["max_loss_diff"] < 1e-3
        assert row["float32"]["losses"] != rows["bf16"]["float32"]["losses"]  # the emulated layers ran


def test_compile_swaps_the_quantizers_and_puts_the_originals_back():
    """``--compile`` times the codes path with the quantizers compiled; after it the package runs its own."""
    from precsearch.fp8 import scaling

    originals = {name: getattr(scaling, name) for name in bench_emulated_gemm.COMPILED}
    bench_emulated_gemm.compiled_quantizers(True)
    try:
        assert all(getattr(scaling, name) is not fn for name, fn in originals.items())
    finally:
        bench_emulated_gemm.compiled_quantizers(False)
    assert all(getattr(scaling, name) is fn for name, fn in originals.items())
