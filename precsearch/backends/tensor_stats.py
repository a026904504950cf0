"""What the FP8 cast did to one operand: the statistics every backend reports (:meth:`Backend.layer_stats`).

A type of the backend contract, so it lives with the backends; the probe's diagnostics
(:mod:`precsearch.probe.measure.diagnostics`) collect and read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class TensorStats:
    """How the FP8 cast treated one operand of one layer in one step.

    Attributes:
        amax: max |x| before quantization (NaN when x held a NaN).
        scale: The per-tensor scale the cast used; None for block/MX recipes.
        overflow: Share of finite values that saturation clipped.
        underflow: Share of values that were non-zero and came back zero.
        nonfinite: Count of NaN/inf values.
        rms: Root mean square of x before quantization (NaN where the backend does not report it); amax / rms
            is the operand's crest factor.
    """

    amax: float
    scale: float | None
    overflow: float
    underflow: float
    nonfinite: int
    rms: float = math.nan

    @classmethod
    def from_quantization(cls, stats: dict[str, Tensor], numel: int) -> TensorStats:
        """From :func:`~precsearch.fp8.formats.quantization_stats` of a tensor of ``numel`` values."""
        scale = stats.get("scale")
        return cls(
            amax=float(stats["amax"]),
            scale=float(scale) if scale is not None else None,
            overflow=float(stats["saturated_frac"]),
            underflow=float(stats["underflow_frac"]),
            nonfinite=round(float(stats["nonfinite_frac"]) * numel),
            rms=float(stats["rms"]) if "rms" in stats else math.nan,
        )


LayerStats = dict[str, dict[str, TensorStats]]
"""Layer name -> tensor role -> :class:`TensorStats`."""
