"""NVFP4: FP4 E2M1 elements, E4M3 block scales and an FP32 tensor scale, as Blackwell runs them.

The format
----------
An E2M1 number is a sign, 2 exponent bits and 1 mantissa bit. Its magnitudes are
``0, 0.5, 1, 1.5, 2, 3, 4, 6``: steps of 0.5 below 2, of 1 in [2, 4), of 2 in
[4, 6]. No infinity, no NaN. With one mantissa bit the relative rounding error
reaches 1/4 (half a step of 0.5 at 1), so a unit Gaussian quantized with 1x16
blocks and round-to-nearest comes back at about 20 dB SQNR (16x16 tiles: 19 dB;
``tests/fp8/test_nvfp4.py``), against about 31 dB for E4M3: the scaling has to
keep each block's values in the 12:1 window between 0.5 and 6.

Two-level scaling (Transformer Engine ``NVFP4BlockScaling``, the NVFP4 paper,
arXiv 2509.25149):

* a per-tensor FP32 scale ``s_enc = 448 * 6 / amax(tensor)`` maps the tensor's
  absolute maximum onto the largest product of an E4M3 block scale (448) and an
  E2M1 value (6);
* each block of 16 consecutive elements (1x16 along the GEMM's reduced
  dimension; 16x16 tiles for weights with 2D scaling) gets a decode scale
  ``block_amax / 6 * s_enc`` stored in **E4M3** (rounded to nearest, so it is
  not a power of two and the block maximum lands within E4M3's 3-bit precision
  of 6). A block whose decode scale falls below E4M3's smallest subnormal (2^-9,
  rounding to 0 below 2^-10) flushes to zero entirely;
* an element is stored as ``q = round_e2m1(x / (s_block / s_enc))``, clamped
  to +-6 (saturation), and read back as ``q * s_block / s_enc``.

The training recipe adds, each switchable:

* **2D weight scaling**: one scale per 16x16 tile of the weight, so the
  row-wise copy (forward) and the column-wise copy (dgrad) hold the same values,
  and forward and backward see one quantized weight;
* **random Hadamard transform** (RHT) on the two operands of the weight-gradient
  GEMM (the input and the output gradient, quantized column-wise): both are
  multiplied along the token dimension, 16 tokens at a time, by one orthogonal
  16x16 matrix ``H = diag(s) H16 / 4`` (Sylvester Hadamard, a random sign vector
  ``s``, the same for every layer). ``(g^T H)(x^T H)^T = g^T x``, so the GEMM is
  unchanged up to quantization, while outliers are spread over 16 values;
* **stochastic rounding** of gradients: a value between two E2M1 neighbours
  rounds up with probability equal to its distance from the lower one over the
  step, so the rounding is unbiased in expectation.

Everything here is float32 arithmetic in plain PyTorch: it runs on any device.
Non-finite inputs stay non-finite (NaN stays NaN, +-inf stays +-inf) so a
diverging run remains visible, as in :mod:`precsearch.fp8.formats`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor


#: Largest E2M1 magnitude.
E2M1_MAX = 6.0
#: Every non-negative E2M1 value, in code order 0..7.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: Scaled magnitudes above this are clipped by saturation: half a top step (2) above 6.
E2M1_CLIP = 7.0
#: Largest E4M3 magnitude, the block scale's format.
E4M3_MAX = 448.0
#: Elements per 1D block, and the side of a 2D weight tile and of the Hadamard matrix.
NVFP4_BLOCK = 16  # the NVFP4 recipe's spec block (tests/recipes/test_contract.py checks they agree)
#: Seed of the one random sign vector shared by every layer's Hadamard transform.
RHT_SIGN_SEED = 0x5EED

_F32_MAX = torch.finfo(torch.float32).max


def _step(a: Tensor) -> Tensor:
    """The spacing of the E2M1 grid at non-negative magnitude ``a`` (0.5, 1 or 2)."""
    return torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))


def round_e2m1(x: Tensor, stochastic: bool = False, generator: torch.Generator | None = None) -> Tensor:
    """Round already-scaled values onto the E2M1 grid (float32 in, float32 out).

    Magnitudes beyond 6 saturate to 6. Round-to-nearest breaks ties to the even
    code (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4, the intervals of TE's reference
    quantizer, ``custom_recipes/reference_nvfp4.py``), which is ``torch.round``'s
    ties-to-even on ``|x| / step``: within each step size the multiple's parity
    is the code's parity.

    Args:
        x: Scaled values.
        stochastic: Round up with probability (|x| - lower) / step instead.
        generator: The random stream for stochastic rounding (default: torch's global one).
    """
    x = x.float()
    a = x.abs().clamp(max=E2M1_MAX)  # clamp keeps NaN
    step = _step(a)
    if stochastic:
        lower = torch.floor(a / step) * step
        u = torch.rand(a.shape, generator=generator, device=a.device, dtype=torch.float32)
        q = lower + step * (u < (a - lower) / step).float()
    else:
        q = torch.round(a / step) * step
    return torch.copysign(q, x)


def e4m3_round(t: Tensor) -> Tensor:
    """``t`` (non-negative) stored as E4M3 and read back: saturates at 448, RNE, subnormals to 2^-9."""
    return t.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float()


def global_encode_scale(amax: Tensor) -> Tensor:
    """``448 * 6 / amax``, capped at the float32 max; 1 where ``amax`` is zero or non-finite."""
    amax = amax.float()
    valid = torch.isfinite(amax) & (amax > 0)
    scale = (E4M3_MAX * E2M1_MAX) / torch.where(valid, amax, 1.0)
    return torch.where(valid, scale.clamp(max=_F32_MAX), 1.0)


def _tile_amax(x: Tensor, tile: tuple[int, int]) -> Tensor:
    """Absolute max per ``tile`` of a 2-d ``x`` (ragged edges zero-padded): shape (R/tr, C/tc)."""
    tr, tc = tile
    a = x.abs()
    a = F.pad(a, (0, -a.shape[1] % tc, 0, -a.shape[0] % tr))
    return a.unflatten(1, (-1, tc)).unflatten(0, (-1, tr)).amax(dim=(1, 3))


def _expand(t: Tensor, tile: tuple[int, int], shape: torch.Size) -> Tensor:
    """Per-tile values back to one per element of ``shape``."""
    full = t.repeat_interleave(tile[0], dim=0).repeat_interleave(tile[1], dim=1)
    return full[: shape[0], : shape[1]]


def nvfp4_quantize(
    x: Tensor,
    tile: tuple[int, int] = (1, NVFP4_BLOCK),
    stochastic: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Quantize-dequantize a 2-d tensor through NVFP4 with tiles along its last dim.

    Args:
        x: A 2-d tensor; blocks run along its last dimension (the GEMM's reduced one).
        tile: (1, 16) for 1D blocks, (16, 16) for 2D weight tiles.
        stochastic: Stochastic rounding of the E2M1 elements (the block scales are always RNE).
        generator: Random stream for stochastic rounding.

    Returns:
        (dequantized float32 tensor like ``x``, E4M3 block decode scales per tile
        as float32, the per-tensor encode scale as a 0-d tensor).
    """
    if x.dim() != 2:
        raise ValueError(f"nvfp4_quantize takes a 2-d tensor, got shape {tuple(x.shape)}")
    x32 = x.detach().float()
    finite = torch.isfinite(x32)
    clean = torch.where(finite, x32, 0.0)  # scales come from the finite values
    s_enc = global_encode_scale(clean.abs().amax() if clean.numel() else clean.new_zeros(()))
    s_dec = 1.0 / s_enc
    block = e4m3_round(_tile_amax(clean, tile) * (s_enc * (1.0 / E2M1_MAX)))
    encode = (1.0 / (block * s_dec)).clamp(max=_F32_MAX)  # a zero block scale: its block flushes to 0
    q = round_e2m1(x32 * _expand(encode, tile, x.shape), stochastic, generator)
    out = q * _expand(block, tile, x.shape) * s_dec
    return torch.where(finite, out, x32), block, s_enc


@functools.lru_cache(maxsize=16)
def _hadamard(size: int, seed: int, device: str) -> Tensor:
    """Built once per (size, seed, device): the wgrad path asks for it twice per layer and step."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:  # Sylvester: H_2n = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (size,), generator=gen, dtype=torch.float64) * 2 - 1
    return (signs[:, None] * h / size**0.5).float().to(device)


def hadamard_matrix(size: int = NVFP4_BLOCK, seed: int = RHT_SIGN_SEED, device: torch.device | str = "cpu") -> Tensor:
    """The random Hadamard matrix ``diag(s) H / sqrt(size)``: orthogonal (``H @ H.T = I``).

    Args:
        size: A power of two (16 in NVFP4).
        seed: Seed of the random sign vector ``s`` (one vector for every layer, as in the paper).
        device: Where to put it.
    """
    if size < 1 or size & (size - 1):
        raise ValueError(f"the Hadamard size must be a power of two, got {size}")
    return _hadamard(size, seed, str(torch.device(device)))


def rht(x: Tensor, matrix: Tensor) -> Tensor:
    """Apply ``matrix`` (d x d) to each run of d consecutive elements of ``x``'s last dim.

    The last dim is zero-padded to a multiple of d (zeros stay zeros under the
    transform and add nothing to a GEMM over that dim), so the result may be wider.
    """
    d = matrix.shape[0]
    x = F.pad(x.float(), (0, -x.shape[-1] % d))
    return (x.unflatten(-1, (-1, d)) @ matrix).flatten(-2)


def nvfp4_stats(x: Tensor, s_enc: Tensor, block: Tensor, tile: tuple[int, int], out: Tensor) -> dict[str, Tensor]:
    """Diagnostics of one NVFP4 cast, with the keys of :func:`~precsearch.fp8.formats.quantization_stats`.

    ``saturated_frac`` counts finite elements whose scaled magnitude exceeded 7
    (half a top step above 6, so rounding alone would not have given 6), and
    ``underflow_frac`` nonzero elements that came back zero (whole flushed blocks included).
    """
    x32 = x.detach().float()
    finite = torch.isfinite(x32)
    decode = _expand(block, tile, x.shape) / s_enc
    scaled = torch.where(decode > 0, x32.abs() / torch.where(decode > 0, decode, 1.0), 0.0)
    return {
        "amax": x32.abs().amax() if x32.numel() else x32.new_zeros(()),
        "saturated_frac": (finite & (scaled > E2M1_CLIP)).float().mean(),
        "underflow_frac": ((x32 != 0) & (out == 0)).float().mean(),
        "nonfinite_frac": (~finite).float().mean(),
        "rms": x32.square().mean().sqrt() if x32.numel() else x32.new_zeros(()),
    }
