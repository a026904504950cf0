"""MXFP8 (TE ``MXFP8BlockScaling``): 1x32 blocks with power-of-two E8M0 scales, on Blackwell's tensor cores."""

from __future__ import annotations

from precsearch.precision import Fp8Format, LayerRecipe, Precision
from precsearch.recipes.base import Recipe
from precsearch.recipes.spec import BLACKWELL, PrecisionSpec
from precsearch.soak import SoakFinding


class MXFP8(Recipe):
    """TE refuses it from sm_120 on; Megatron can run the output layer in it (``--fp8-output-proj``)."""

    precision = Precision.MXFP8
    spec = PrecisionSpec("MXFP8", 8, (1, 32), (1, 32), 1, min_capability=BLACKWELL, gemm_speedup=2.0,
                         te_recipe="MXFP8BlockScaling", megatron_recipe="mxfp8", megatron_config="mxfp8",
                         torchtitan=("quantize.linear.mx", "mx", "mxfp8_cublas_rceil"))
    settings = ("fp8_format",)
    emulation = "mx"
    # TE runs MXFP8 from sm_100 only: its row is precsearch's emulation of it, on an H100
    soak = SoakFinding("mxfp8_emulated", -0.47, 0.91, 8, card="H100 80 GB", date="2026-12-07",
                       ran="HYBRID, emulated")
    te_max_capability = (12, 0)
    te_dim_multiple = 32  # scales 1x32 blocks along the reduced dim
    torchao_never = "MXFP8 is not wired to torchao in precsearch; use the te backend"
    megatron_output_proj = True
    converter_format = Fp8Format.E4M3  # torchao's MX recipes cast gradients to E4M3
    accelerate_te = True

    def accelerate_te_kwargs(self, layer: LayerRecipe) -> str:
        return f'fp8_format="{Fp8Format(layer.fp8_format).value.upper()}", use_mxfp8_block_scaling=True'

    def accelerate_te_problem(self, layer: LayerRecipe) -> str | None:
        if Fp8Format(layer.fp8_format) is Fp8Format.E4M3:
            return None
        return ("hybrid MXFP8 cannot reach TE through TERecipeKwargs (fp8_format='HYBRID' is Accelerate's default, "
                "so it is dropped and MXFP8BlockScaling uses E4M3)")
