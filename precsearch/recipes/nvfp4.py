"""NVFP4 (TE ``NVFP4BlockScaling``): E2M1 elements, an E4M3 scale per 16 elements and an FP32 tensor scale."""

from __future__ import annotations

from typing import Any

from precsearch.precision import LayerRecipe, Precision
from precsearch.recipes.base import Recipe
from precsearch.recipes.spec import BLACKWELL, PrecisionSpec

#: Each switch -> the TE environment variable that turns it off (read at TE import; Megatron has no flag).
TE_ENVIRONMENT = {
    "nvfp4_rht": "NVTE_NVFP4_DISABLE_RHT",
    "nvfp4_stochastic_rounding": "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING",
    "nvfp4_2d_weights": "NVTE_NVFP4_DISABLE_2D_QUANTIZATION",
}


class NVFP4(Recipe):
    """Fixed formats (no FP8 format to choose); reads its three switches; Megatron's ``--fp4-recipe``."""

    precision = Precision.NVFP4
    # weights: TE's default 16x16 tiles
    spec = PrecisionSpec("NVFP4", 4, (1, 16), (16, 16), 1, min_capability=BLACKWELL, gemm_speedup=4.0,
                         te_recipe="NVFP4BlockScaling", megatron_recipe="nvfp4", megatron_config="nvfp4")
    settings = ("nvfp4_rht", "nvfp4_2d_weights", "nvfp4_stochastic_rounding")
    emulation = "two_level_fp4"
    soak = None
    # TE runs NVFP4 from sm_100 only: its row is precsearch's emulation of it (every block Linear), on an H100
    soak_refused = ("bench_soak row nvfp4_emulated (every block Linear NVFP4, its switches on, precsearch's "
                    "emulation) diverged at 2,000 annealed steps: seed 7's held-out loss ended +22.2% above its "
                    "pair's, and seed 6's +16.8% (within 3% of its pair's to step 950); 8 seeds +5.82% ± "
                    "3.14%, 0 non-finite (H100 80 GB, 2026-12-07)")
    te_stats_observable = False  # its two-level scales are not reproduced for TE's tensor statistics
    torchao_never = "NVFP4 is not wired to torchao in precsearch; use the te backend"
    torchtitan_never = "nvfp4 recipe"

    def te_kwargs(self, layer: LayerRecipe) -> dict[str, Any]:
        # passed explicitly: TE reads their defaults from NVTE_NVFP4_DISABLE_* at import
        return {"disable_rht": not layer.nvfp4_rht,
                "disable_stochastic_rounding": not layer.nvfp4_stochastic_rounding,
                "disable_2d_quantization": not layer.nvfp4_2d_weights}

    def megatron_flags(self, layer: LayerRecipe) -> list[str]:
        return ["--fp4-format", "e2m1", "--fp4-recipe", self.spec.megatron_recipe]

    def megatron_training_recipe(self, fp8_format: str) -> dict[str, Any]:
        return {"fp4_quantization_recipe": self.spec.megatron_recipe}

    def megatron_environment(self, layer: LayerRecipe) -> dict[str, str]:
        return {env: "0" if getattr(layer, knob) else "1" for knob, env in TE_ENVIRONMENT.items()}
