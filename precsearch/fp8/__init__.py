"""Emulated low-precision numerics: FP8 element formats (:mod:`.formats`), NVFP4 (:mod:`.nvfp4`),
scaling recipes (:mod:`.scaling`)."""

from precsearch.fp8.formats import (
    E4M3,
    E5M2,
    e8m0_round_scale,
    fp8_dtype,
    fp8_max,
    quantization_stats,
    quantize_dequantize,
)
from precsearch.fp8.nvfp4 import hadamard_matrix, nvfp4_quantize, round_e2m1
from precsearch.fp8.scaling import (
    ROLES,
    BlockScaler,
    CurrentScaler,
    DelayedScaler,
    MXScaler,
    NVFP4Scaler,
    Scaler,
    make_scaler,
    role_format,
)

__all__ = [
    "E4M3",
    "E5M2",
    "ROLES",
    "BlockScaler",
    "CurrentScaler",
    "DelayedScaler",
    "MXScaler",
    "NVFP4Scaler",
    "Scaler",
    "e8m0_round_scale",
    "fp8_dtype",
    "fp8_max",
    "hadamard_matrix",
    "make_scaler",
    "nvfp4_quantize",
    "quantization_stats",
    "quantize_dequantize",
    "role_format",
    "round_e2m1",
]
