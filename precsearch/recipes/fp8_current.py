"""FP8 current scaling (TE ``Float8CurrentScaling``, torchao ``tensorwise``): one scale per tensor from its own amax."""

from __future__ import annotations

from precsearch.precision import Fp8Format, Precision
from precsearch.recipes.base import Recipe
from precsearch.recipes.spec import ADA, BLACKWELL, PrecisionSpec
from precsearch.soak import SoakFinding


class FP8Current(Recipe):
    """The one precision every framework names: TE, Megatron, torchao, torchtitan's float8 converter."""

    precision = Precision.FP8_CURRENT
    spec = PrecisionSpec("FP8 current scaling", 8, min_capability=ADA, gemm_speedup=2.0,
                         te_recipe="Float8CurrentScaling", megatron_recipe="tensorwise",
                         megatron_config="fp8_tensorwise", torchao_recipe="tensorwise",
                         torchtitan=("quantize.linear.float8", "float8", "tensorwise"))
    settings = ("fp8_format",)
    emulation = "current"
    soak = SoakFinding("fp8_current", 0.35, 1.05, 8, ran="HYBRID")
    te_fp8_attention_from = BLACKWELL  # TE fuses FP8 attention under current scaling on sm_100 only
    head_transient_bytes = 17.6
    converter_format = Fp8Format.HYBRID  # torchao's tensorwise recipe casts gradients to E5M2
