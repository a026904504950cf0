"""FP8 block scaling (TE ``Float8BlockScaling``): an fp32 scale per 1x128 activation block, per 128x128 weight block."""

from __future__ import annotations

from precsearch.precision import Precision
from precsearch.recipes.base import Recipe
from precsearch.recipes.spec import HOPPER, PrecisionSpec
from precsearch.soak import SoakFinding


class FP8Block(Recipe):
    """Hopper and CUDA 12.9 under TE; torchao and torchtitan scale per tensor or row, never in blocks."""

    precision = Precision.FP8_BLOCK
    spec = PrecisionSpec("FP8 block scaling", 8, (1, 128), (128, 128), 4, min_capability=HOPPER,
                         gemm_speedup=2.0, te_recipe="Float8BlockScaling", megatron_recipe="blockwise",
                         megatron_config="fp8_blockwise")
    settings = ("fp8_format",)
    emulation = "block"
    soak = SoakFinding("fp8_block", -1.70, 1.09, 8, ran="E4M3")
    te_min_cuda = (12, 9)
    head_transient_bytes = 21.6
    torchao_never = ("torchao float8 training scales per tensor or per row, not in 1x128/128x128 blocks; "
                     "use the te backend")
    torchtitan_never = "fp8_block recipe"
