"""Emulated FP8 numerics: element formats (:mod:`.formats`), scaling recipes (:mod:`.scaling`)."""

from precsearch.fp8.formats import (
    E4M3,
    E5M2,
    e8m0_round_scale,
    fp8_dtype,
    fp8_max,
    quantization_stats,
    quantize_dequantize,
)
from precsearch.fp8.scaling import (
    BlockScaler,
    CurrentScaler,
    DelayedScaler,
    MXScaler,
    Scaler,
    make_scaler,
    role_format,
)

__all__ = [
    "E4M3",
    "E5M2",
    "BlockScaler",
    "CurrentScaler",
    "DelayedScaler",
    "MXScaler",
    "Scaler",
    "e8m0_round_scale",
    "fp8_dtype",
    "fp8_max",
    "make_scaler",
    "quantization_stats",
    "quantize_dequantize",
    "role_format",
]
