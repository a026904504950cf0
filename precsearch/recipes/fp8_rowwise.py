"""FP8 rowwise scaling (torchao ``Float8LinearRecipeName.ROWWISE``, torchtitan's float8 converter ``rowwise``).

Each GEMM operand is scaled along the dim its GEMM reduces: one scale per row of the activation and gradient,
one per output channel of the weight (per column of the wgrad GEMM's operands), each rounded down to a power
of two, E4M3 for every role, gradients included. Hopper's rowwise-scaled GEMM (CUTLASS, through
``torch._scaled_mm``) runs it; Transformer Engine and Megatron have no such recipe.
"""

from __future__ import annotations

from precsearch.precision import Fp8Format, Precision
from precsearch.recipes.base import Recipe
from precsearch.recipes.spec import HOPPER, PrecisionSpec
from precsearch.soak import SoakFinding


class FP8Rowwise(Recipe):
    """torchao and torchtitan name it; TE and Megatron do not. Fixed formats: no setting of the policy reaches it."""

    precision = Precision.FP8_ROWWISE
    spec = PrecisionSpec("FP8 rowwise scaling", 8, min_capability=HOPPER, gemm_speedup=2.0, torchao_recipe="rowwise",
                         torchtitan=("quantize.linear.float8", "float8", "rowwise"))
    emulation = "row"
    # TE has no rowwise recipe: its row is precsearch's emulation of torchao's, on an H100; one seed (6) ended
    # +16.4% above its pair, short of diverged (+20%), so the mean is undecided at both levels, not damaging
    soak = SoakFinding("fp8_rowwise_emulated", 2.10, 2.12, 8, card="H100 80 GB", date="2026-12-07",
                       ran="E4M3, emulated", worst_pct=16.4)
    te_never = ("Transformer Engine has no rowwise FP8 recipe (it scales per tensor, in 1x128 blocks, or MX/NVFP4 "
                "blocks); use the torchao backend")
    te_stats_observable = False
    megatron_never = ("Megatron-LM has no rowwise FP8 recipe (--fp8-recipe takes delayed, tensorwise, blockwise or "
                      "mxfp8)")
    converter_format = Fp8Format.E4M3  # torchao's rowwise recipe casts every role to E4M3
