"""FP8 element formats and the quantize-dequantize round trip.

FP8 numerics in one place
-------------------------
An FP8 number is a sign bit, an exponent and a mantissa. Two encodings are used
for training:

* **E4M3** (``torch.float8_e4m3fn``): 4 exponent bits, 3 mantissa bits, bias 7.
  Largest value 448, smallest normal 2^-6, subnormals down to 2^-9. The "fn"
  variant has **no infinity**: the only special value is NaN. It has more
  precision and less range, so it is used for activations and weights.
* **E5M2** (``torch.float8_e5m2``): 5 exponent bits, 2 mantissa bits, bias 15.
  Largest value 57344, smallest normal 2^-14, subnormals down to 2^-16. It keeps
  IEEE infinities. More range, less precision: used for gradients in the
  "hybrid" recipe.

With 3 (or 2) mantissa bits every value carries a relative rounding error of up
to 2^-4 (or 2^-3), so a well-scaled Gaussian tensor comes back with a
signal-to-quantization-noise ratio of roughly 31 dB (E4M3) or 25 dB (E5M2).

**Scaling.** The range is tiny, so tensors are multiplied by a ``scale`` before
the cast and divided by it after: ``dequant = cast(x * scale) / scale``. A good
scale maps the tensor's absolute maximum (amax) close to the format's maximum,
e.g. ``scale = 448 / amax``. Scales may be per tensor, per block of elements, or
restricted to powers of two (E8M0 in the OCP MX spec), which makes the division
exact.

**Saturation vs overflow.** A scaled value beyond the largest finite value
would overflow (to NaN in E4M3, to infinity in E5M2). Like Transformer Engine,
we *saturate* instead: scaled values are clamped to +-max before the cast. This
is where a stale scale hurts: a tensor that grew since its scale was chosen is
silently clipped. Inputs that are already NaN or infinite are **not** clamped:
they stay non-finite so a diverging run stays visible.

**Underflow.** The cast rounds to nearest, ties to even, through the subnormal
range. A scaled value smaller than half the smallest subnormal (2^-10 for E4M3,
2^-17 for E5M2) rounds to zero: it underflows and its information is lost.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ElemFormat = Literal["e4m3", "e5m2"]
"""The encoding of one FP8 element (distinct from the recipe-level ``Fp8Format``)."""

E4M3: ElemFormat = "e4m3"
E5M2: ElemFormat = "e5m2"

_F32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class FormatSpec:
    """The numeric limits of one FP8 element format.

    Attributes:
        dtype: The torch dtype that stores it.
        max: Largest finite magnitude.
        emax: Exponent of the largest power of two it can represent (the OCP MX
            ``emax_elem``).
        mantissa_bits: Explicit mantissa bits (3 or 2).
        min_normal: Smallest normal magnitude.
        min_subnormal: Smallest nonzero (subnormal) magnitude.
    """

    dtype: torch.dtype
    max: float
    emax: int
    mantissa_bits: int
    min_normal: float
    min_subnormal: float

    @property
    def clip_threshold(self) -> float:
        """Scaled magnitudes above this are clipped by saturation (max + half a step).

        Below it, round-to-nearest would have given ``max`` anyway.
        """
        return self.max + 2.0 ** (self.emax - self.mantissa_bits - 1)


_SPECS: dict[str, FormatSpec] = {
    E4M3: FormatSpec(torch.float8_e4m3fn, 448.0, 8, 3, 2.0**-6, 2.0**-9),
    E5M2: FormatSpec(torch.float8_e5m2, 57344.0, 15, 2, 2.0**-14, 2.0**-16),
}


def format_spec(fmt: str) -> FormatSpec:
    """The limits of an element format.

    Args:
        fmt: ``"e4m3"`` or ``"e5m2"``.

    Raises:
        ValueError: For any other name.
    """
    try:
        return _SPECS[fmt]
    except KeyError:
        raise ValueError(f"unknown FP8 element format {fmt!r}; valid: e4m3, e5m2") from None


def fp8_dtype(fmt: str) -> torch.dtype:
    """The torch dtype for ``fmt`` (``float8_e4m3fn`` or ``float8_e5m2``)."""
    return format_spec(fmt).dtype


def fp8_max(fmt: str) -> float:
    """The largest finite magnitude of ``fmt`` (448 or 57344)."""
    return format_spec(fmt).max


def smallest_scalable_amax(fmt: str) -> float:
    """The smallest amax whose scale ``max / amax`` and inverse ``amax / max`` are both normal FP32 numbers:
    ``max * FLT_MIN`` (5.3e-36 for E4M3). Below it ``max / amax`` overflows (under 1.3e-36) or ``amax / max`` is
    subnormal, which a GPU flushes to 0; a value that small rounds to an FP8 zero under scale 1 anyway."""
    return fp8_max(fmt) * torch.finfo(torch.float32).tiny


def quantize_dequantize(x: Tensor, scale: Tensor | float, fmt: str, amax: Tensor | None = None) -> Tensor:
    """Round-trip ``x`` through FP8: ``cast(clamp(x * scale)) / scale``.

    Args:
        x: Any floating tensor.
        scale: Positive finite scale, broadcastable to ``x`` (a 0-d tensor for
            per-tensor scaling, an expanded tensor for block scaling).
        fmt: ``"e4m3"`` or ``"e5m2"``.
        amax: ``max |x|`` (0-d, or one per block) if the caller has it: on a CPU
            it tells, for free, whether ``x`` holds an infinity to put back.

    Returns:
        A float32 tensor shaped (and strided) like ``x`` holding exactly the values an FP8
        GEMM would see (after dividing the scale back out). Scaled values beyond
        the format's max saturate; NaN and +-inf in ``x`` stay NaN and +-inf.
    """
    spec = format_spec(fmt)
    x32 = x.float()
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    codes = (x32 * scale).clamp_(-spec.max, spec.max).to(spec.dtype)  # saturate; clamp keeps NaN
    out = _dequantize(codes, scale, fmt)
    if not _may_hold_inf(x32, amax):
        return out
    # clamp turned +-inf into +-max: put the infinities back so they stay visible
    return torch.where(torch.isinf(x32), x32, out)


@functools.cache
def _decode_table(fmt: str, device: torch.device) -> Tensor:
    """The float32 value of each of the 256 codes of ``fmt``, in code order."""
    return torch.arange(256, dtype=torch.uint8, device=device).view(format_spec(fmt).dtype).float()


def _dequantize(codes: Tensor, scale: Tensor, fmt: str) -> Tensor:
    """``codes.float() / scale``, strided like ``codes``.

    A CPU converts FP8 to float32 one element at a time (about 3 ns each); a look-up in
    the 256-entry table of code values costs a seventh of that. With a per-tensor scale
    the division is folded into the table: each entry is divided by the same scale, as
    each element would be, so the values are the same to the bit.
    """
    flip = codes.dim() == 2 and not codes.is_contiguous()  # a transpose? gather in memory order
    ordered = codes.t() if flip else codes
    if codes.device.type != "cpu" or not ordered.is_contiguous():
        return codes.float() / scale
    table = _decode_table(fmt, codes.device)
    per_tensor = scale.dim() == 0
    if per_tensor:
        table = table / scale
    out = table.index_select(0, ordered.view(torch.uint8).reshape(-1).long()).view(ordered.shape)
    out = out.t() if flip else out
    return out if per_tensor else out / scale


def _may_hold_inf(x32: Tensor, amax: Tensor | None) -> bool:
    """False only where ``x32`` surely holds no infinity (so no value needs putting back).

    Asked only on a CPU, where reading a value back costs nothing; elsewhere the answer
    is always True rather than a wait for the device.
    """
    if x32.device.type != "cpu":
        return True
    if x32.numel() == 0:
        return False
    if amax is None:
        amax = x32.abs().amax()
    if amax.numel() == 1:  # a per-tensor amax: read on the host, not through four tensor ops
        return not math.isfinite(float(amax))  # a NaN amax may hide an inf as well
    return not bool(torch.isfinite(amax).all())


def quantization_stats(
    x: Tensor, scale: Tensor | float, fmt: str, dequantized: Tensor | None = None
) -> dict[str, Tensor]:
    """How much of ``x`` the FP8 cast clipped or flushed, for diagnostics.

    Computed with tensor ops only (no host sync); the values are 0-d float32
    tensors, call ``float()`` on them when logging.

    Args:
        x: The tensor before quantization.
        scale: The scale used (broadcastable to ``x``).
        fmt: ``"e4m3"`` or ``"e5m2"``.
        dequantized: The result of :func:`quantize_dequantize` for these
            arguments, if already computed (saves recomputing it).

    Returns:
        ``amax`` (max |x|, NaN if x has a NaN), ``saturated_frac`` (fraction of
        finite elements that saturation clipped: scaled magnitude beyond max by
        more than half a step, so rounding alone would not have given max),
        ``underflow_frac`` (fraction of elements that were nonzero and came back
        zero), ``nonfinite_frac`` (fraction of NaN/inf elements) and ``rms`` (the
        root mean square of ``x``: amax over it is the tensor's crest factor, high where
        a few channels carry massive activations, which per-tensor scaling serves worst).
    """
    x32 = x.detach().float()
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if dequantized is None:
        dequantized = quantize_dequantize(x32, scale, fmt)
    finite = torch.isfinite(x32)
    # not "> max": the amax element often lands an ulp above max in float32
    saturated = finite & ((x32 * scale).abs() > format_spec(fmt).clip_threshold)
    underflow = (x32 != 0) & (dequantized == 0)
    amax = x32.abs().amax() if x32.numel() else x32.new_zeros(())
    return {
        "amax": amax,
        "saturated_frac": saturated.float().mean(),
        "underflow_frac": underflow.float().mean(),
        "nonfinite_frac": (~finite).float().mean(),
        "rms": x32.square().mean().sqrt() if x32.numel() else x32.new_zeros(()),
    }


def pow2_floor(t: Tensor) -> Tensor:
    """The largest power of two <= ``t`` for positive finite ``t`` (exact, via frexp)."""
    _, exp = torch.frexp(t)  # t = m * 2**exp with m in [0.5, 1)
    return torch.ldexp(torch.ones_like(t), exp - 1)


def scale_from_amax(amax: Tensor, fmt: str, margin: int = 0, pow2: bool = False) -> Tensor:
    """The scale that maps ``amax`` onto the format's max: ``max / amax / 2**margin``.

    Where ``amax`` is zero or non-finite there is nothing sensible to fit, so the
    scale is 1. A tiny ``amax`` would give an infinite scale; it is capped at the
    float32 maximum (as Transformer Engine does).

    Args:
        amax: Absolute maxima (any shape; one scale per element).
        fmt: ``"e4m3"`` or ``"e5m2"``.
        margin: Headroom in powers of two.
        pow2: Round the scale down to a power of two (never maps amax past max).
    """
    amax = amax.float()
    valid = torch.isfinite(amax) & (amax > 0)
    scale = fp8_max(fmt) / torch.where(valid, amax, 1.0) / 2.0**margin
    scale = torch.where(valid, scale, 1.0).clamp(max=_F32_MAX)
    return pow2_floor(scale) if pow2 else scale


def e8m0_round_scale(amax: Tensor, fmt: str, rounding: str = "up") -> Tensor:
    """The power-of-two (E8M0) MX scale for blocks with absolute max ``amax``.

    The block's shared exponent X (the stored E8M0 value) is chosen one of two ways:

    * ``rounding="up"`` (Transformer Engine MXFP8): ``X = ceil(log2(amax / max))``,
      the smallest power of two that brings the block max within the format's
      max, so nothing saturates.
    * ``rounding="ocp"`` (OCP MX v1.0 spec): ``X = floor(log2(amax)) - emax_elem``
      (emax is 8 for E4M3, 15 for E5M2). The scaled block max lands in
      ``[2**emax, 2**(emax+1))``, so for E4M3 values in (448, 512) saturate.

    X is clamped to E8M0's range [-127, 127]; zero or non-finite blocks get X = 0.

    Args:
        amax: Per-block absolute maxima.
        fmt: ``"e4m3"`` or ``"e5m2"``.
        rounding: ``"up"`` or ``"ocp"``.

    Returns:
        The multiplier ``2**-X`` applied before the cast (float32, shaped like ``amax``).
    """
    spec = format_spec(fmt)
    amax = amax.float()
    valid = torch.isfinite(amax) & (amax > 0)
    safe = torch.where(valid, amax, 1.0)
    mant, exp = torch.frexp(safe)  # amax = mant * 2**exp, mant in [0.5, 1)
    if rounding == "up":
        # ceil(log2(amax / max)) from the frexp parts, exact and free of the
        # float32 underflow that dividing a tiny amax by max would risk
        max_mant, max_exp = math.frexp(spec.max)
        shared = exp - max_exp + (mant > max_mant).to(exp.dtype)
    elif rounding == "ocp":
        shared = exp - 1 - spec.emax  # floor(log2 amax) == exp - 1
    else:
        raise ValueError(f"unknown E8M0 rounding {rounding!r}; valid: up, ocp")
    shared = torch.where(valid, shared.clamp(-127, 127), torch.zeros_like(shared))
    return torch.ldexp(torch.ones_like(amax), -shared)
