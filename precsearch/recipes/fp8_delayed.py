"""FP8 delayed scaling (TE ``DelayedScaling``): one scale per tensor from the amax history of earlier steps.

Stale by design: a tensor that grows between steps saturates, which is the failure the search measures.
"""

from __future__ import annotations

from typing import Any

from precsearch.precision import AmaxAlgo, Fp8Format, LayerRecipe, Precision
from precsearch.recipes.base import Recipe, amax_algo
from precsearch.recipes.spec import ADA, HOPPER, PrecisionSpec
from precsearch.soak import SoakFinding


class FP8Delayed(Recipe):
    """Reads the FP8 format and the three history settings; Megatron selects it globally only."""

    precision = Precision.FP8_DELAYED
    spec = PrecisionSpec("FP8 delayed scaling", 8, min_capability=ADA, gemm_speedup=2.0,
                         te_recipe="DelayedScaling", megatron_recipe="delayed")
    settings = ("fp8_format", "amax_history_len", "amax_compute_algo", "margin")
    emulation = "delayed"
    history = True
    soak = SoakFinding("fp8_delayed", -1.53, 1.25, 8, ran="HYBRID, amax history 1024, max")
    te_fp8_attention_from = HOPPER  # TE 2.20 fuses FP8 attention on Hopper under delayed scaling only
    #: measured on the H200 with TE 2.20.2 (see probe/memory/peak.py's head_transient_bytes)
    head_transient_bytes = 17.6
    torchao_never = ("torchao float8 training has only dynamic scaling (delayed scaling was removed); "
                     "use fp8_current or the te backend")
    torchtitan_never = "delayed scaling"
    accelerate_te = True

    def te_kwargs(self, layer: LayerRecipe) -> dict[str, Any]:
        return {**super().te_kwargs(layer), "amax_history_len": layer.amax_history_len,
                "amax_compute_algo": amax_algo(layer), "margin": layer.margin}

    def megatron_flags(self, layer: LayerRecipe) -> list[str]:
        return [*super().megatron_flags(layer), "--fp8-amax-history-len", str(layer.amax_history_len),
                "--fp8-amax-compute-algo", amax_algo(layer), "--fp8-margin", str(layer.margin)]

    def accelerate_te_kwargs(self, layer: LayerRecipe) -> str:
        return (f'fp8_format="{Fp8Format(layer.fp8_format).value.upper()}", amax_history_len={layer.amax_history_len}, '
                f'amax_compute_algo="{amax_algo(layer)}", margin={layer.margin}')

    def accelerate_te_problem(self, layer: LayerRecipe) -> str | None:
        if AmaxAlgo(layer.amax_compute_algo) is AmaxAlgo.MAX:
            return None
        return ("amax_compute_algo most_recent cannot reach TE through TERecipeKwargs (Accelerate drops values "
                "equal to its defaults and TE's default is max)")
