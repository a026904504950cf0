"""FP8 element formats: saturation, underflow, rounding, non-finite values, SQNR."""

from __future__ import annotations

import math

import pytest
import torch

from precsearch.fp8.formats import (
    e8m0_round_scale,
    fp8_dtype,
    fp8_max,
    pow2_floor,
    quantization_stats,
    quantize_dequantize,
    scale_from_amax,
)

INF, NAN = float("inf"), float("nan")


def qdq(values: list[float], fmt: str, scale: float = 1.0) -> list[float]:
    """Quantize-dequantize a list of floats (float64 input) and return floats."""
    x = torch.tensor(values, dtype=torch.float64)
    return quantize_dequantize(x, torch.tensor(scale), fmt).tolist()


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``approx`` against a float64 reference."""
    ref = ref.double()
    noise = (ref - approx.double()).pow(2).sum()
    return 10 * math.log10(ref.pow(2).sum().item() / noise.item())


def test_dtype_and_max_per_format():
    """The format table is wrong: a role would be cast to the wrong dtype or clamped wrongly."""
    assert fp8_dtype("e4m3") is torch.float8_e4m3fn
    assert fp8_dtype("e5m2") is torch.float8_e5m2
    assert fp8_max("e4m3") == 448.0
    assert fp8_max("e5m2") == 57344.0
    with pytest.raises(ValueError, match="e4m3, e5m2"):
        fp8_max("e3m4")


def test_e4m3_saturates_to_448_not_nan():
    """Overflow would turn into NaN (E4M3 has no inf) instead of saturating as TE does."""
    out = qdq([448.0, 449.0, 464.0, 500.0, 1e4, -1e6], "e4m3")
    assert out == [448.0, 448.0, 448.0, 448.0, 448.0, -448.0]


def test_e5m2_has_wider_range():
    """E5M2 would not be the wide-range format, so hybrid gradients would clip at 448."""
    assert qdq([1e4], "e4m3") == [448.0]
    assert qdq([1e4], "e5m2")[0] == pytest.approx(1e4, rel=0.125)
    assert qdq([57344.0, 6e4, -1e9], "e5m2") == [57344.0, 57344.0, -57344.0]


@pytest.mark.parametrize(
    "fmt, kept, flushed",
    [
        # smallest subnormal 2^-9; half of it is a tie that rounds to even (zero)
        ("e4m3", [2.0**-9, 0.75 * 2.0**-9], [2.0**-10, 2.0**-11, 1e-30]),
        ("e5m2", [2.0**-16, 0.75 * 2.0**-16], [2.0**-17, 2.0**-18, 1e-30]),
    ],
)
def test_underflow_flushes_to_zero(fmt, kept, flushed):
    """Tiny values would survive (no subnormal rounding) or subnormals would be lost."""
    smallest = 2.0**-9 if fmt == "e4m3" else 2.0**-16
    assert qdq(kept, fmt) == [smallest] * len(kept)
    assert qdq(flushed, fmt) == [0.0] * len(flushed)


def test_subnormals_are_kept():
    """Values between the smallest subnormal and the smallest normal would be flushed."""
    assert qdq([3 * 2.0**-9, 2.0**-7], "e4m3") == [3 * 2.0**-9, 2.0**-7]
    assert qdq([2.0**-15], "e5m2") == [2.0**-15]


def test_round_to_nearest_even_hand_checked():
    """Rounding would be truncation or round-half-up instead of round-to-nearest-even."""
    # E4M3 spacing in [1, 2) is 1/8: 1.0625 ties to 1.0 (even), 1.1875 to 1.25 (even)
    assert qdq([1.0625, 1.1875, 1.0624, 1.0626], "e4m3") == [1.0, 1.25, 1.0, 1.125]
    # subnormal tie: 3*2^-10 lies between 2^-9 (odd mantissa) and 2^-8 (even)
    assert qdq([3 * 2.0**-10], "e4m3") == [2.0**-8]
    # E5M2 spacing in [1, 2) is 1/4: 1.125 ties to 1.0, 1.375 ties to 1.5
    assert qdq([1.125, 1.375, -1.375], "e5m2") == [1.0, 1.5, -1.5]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_nan_and_inf_propagate(fmt):
    """A diverging run would be hidden: NaN/inf clamped to finite values."""
    out = qdq([NAN, INF, -INF, 1.0], fmt, scale=2.0)
    assert math.isnan(out[0])
    assert out[1:] == [INF, -INF, 1.0]


def test_scale_is_applied_and_divided_back():
    """The scale would be ignored or applied the wrong way round."""
    # 1000 saturates unscaled but is representable after scaling by 1/4 (250 -> 256)
    assert qdq([1000.0], "e4m3", scale=0.25) == [1024.0]
    # with a power-of-two scale, qdq(x, s) == qdq(x * s, 1) / s exactly
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    s = torch.tensor(64.0)
    torch.testing.assert_close(
        quantize_dequantize(x, s, "e4m3"), quantize_dequantize(x * s, 1.0, "e4m3") / s,
        rtol=0, atol=0,
    )


def test_output_is_float32():
    """The round trip would keep bf16, adding a second rounding to the emulation."""
    out = quantize_dequantize(torch.ones(4, dtype=torch.bfloat16), 1.0, "e4m3")
    assert out.dtype == torch.float32


@pytest.mark.parametrize("fmt, low, high", [("e4m3", 30.0, 34.0), ("e5m2", 24.0, 28.0)])
def test_sqnr_gaussian_current_scaling(fmt, low, high):
    """Quantization error would be too large (wrong rounding/scale) or absent (no cast).

    Measured: E4M3 31.5 dB, E5M2 25.6 dB (3 and 2 mantissa bits).
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, dtype=torch.float64, generator=gen)
    scale = fp8_max(fmt) / x.abs().max().float()
    snr = sqnr_db(x, quantize_dequantize(x, scale, fmt))
    assert low < snr < high


def test_quantization_stats_counts():
    """Diagnostics would miscount clipped, flushed or non-finite elements."""
    x = torch.tensor([1000.0, 1.0, 1e-5, 0.0, NAN])
    stats = quantization_stats(x, torch.tensor(1.0), "e4m3")
    assert stats["saturated_frac"].item() == pytest.approx(0.2)
    assert stats["underflow_frac"].item() == pytest.approx(0.2)  # 1e-5, not the zero
    assert stats["nonfinite_frac"].item() == pytest.approx(0.2)
    assert math.isnan(stats["amax"].item())
    finite = quantization_stats(x[:4], 1.0, "e5m2")
    assert finite["amax"].item() == 1000.0 and finite["saturated_frac"].item() == 0.0


def test_saturation_counts_only_real_clipping():
    """A value that rounds to max anyway (amax landing an ulp above 448) would count as clipped.

    E4M3 steps by 32 near 448, so only scaled values above 464 lose more than rounding does.
    """
    x = torch.tensor([448.0001, 460.0, 464.0, 470.0, 1e4])
    assert quantization_stats(x, 1.0, "e4m3")["saturated_frac"].item() == pytest.approx(0.4)
    y = torch.tensor([57344.0, 61000.0, 62000.0, 1e6])
    assert quantization_stats(y, 1.0, "e5m2")["saturated_frac"].item() == pytest.approx(0.5)


def test_scale_from_amax():
    """Scales for zero/inf amax would be inf/0 and poison the tensor; pow2 would not be a power."""
    amax = torch.tensor([448.0, 3.0, 0.0, INF, NAN])
    scale = scale_from_amax(amax, "e4m3")
    assert scale.tolist()[:2] == [1.0, pytest.approx(448 / 3)]
    assert scale.tolist()[2:] == [1.0, 1.0, 1.0]
    assert scale_from_amax(torch.tensor(3.0), "e4m3", margin=2).item() == pytest.approx(448 / 12)
    assert scale_from_amax(torch.tensor(3.0), "e4m3", pow2=True).item() == 128.0
    assert pow2_floor(torch.tensor([1.0, 3.0, 0.3])).tolist() == [1.0, 2.0, 0.25]
    assert torch.isfinite(scale_from_amax(torch.tensor(1e-44), "e4m3"))


def test_e8m0_scales_are_powers_of_two():
    """MX scales would not be E8M0 (powers of two) or would map block maxima wrongly."""
    amax = torch.cat([torch.logspace(-20, 20, 200, base=2.0), torch.tensor([448.0, 256.0])])
    up = e8m0_round_scale(amax, "e4m3", "up")
    ocp = e8m0_round_scale(amax, "e4m3", "ocp")
    for scale in (up, ocp):
        assert torch.equal(torch.log2(scale), torch.log2(scale).round())
    # TE rounds the exponent up: the block max lands in (224, 448], never saturating
    assert bool(((amax * up > 224) & (amax * up <= 448)).all())
    # the OCP rule puts it in [256, 512): maxima above 448 saturate
    assert bool(((amax * ocp >= 256) & (amax * ocp < 512)).all())


def test_e8m0_edge_cases():
    """Zero/non-finite blocks would get inf/NaN scales; the exponent would leave E8M0 range."""
    amax = torch.tensor([0.0, INF, NAN, 448.0, 449.0, 1e-45, 3e38])
    up = e8m0_round_scale(amax, "e4m3").tolist()
    assert up[:5] == [1.0, 1.0, 1.0, 1.0, 0.5]
    assert up[5] == 2.0**127  # clamped at the E8M0 maximum exponent
    assert e8m0_round_scale(torch.tensor([1.0]), "e4m3", "ocp").item() == 256.0
    assert e8m0_round_scale(torch.tensor([1.0]), "e5m2", "ocp").item() == 2.0**15
    with pytest.raises(ValueError):
        e8m0_round_scale(amax, "e4m3", "down")
