"""float32 values rounded to BF16 and FP16 by integer arithmetic on their bits: the same values as a cast there
and back, but no compiler can fold them away.

The fixed-state reading's compare step rounds moments and kept weights to their storage inside one compiled
chain (:mod:`.compare`). Written as ``x.to(torch.bfloat16).float()``, that round trip is a pair of casts an
optimising compiler may treat as a no-op: on the H200 (torch 2.11, inductor's Triton kernels, with
``emulate_precision_casts`` set) the compiled compare did not round BF16 moments or a BF16/FP16 kept weight, and
the update error's Gram matrix came out 3e-4 to 67% off the op-by-op one (tests/backends/test_gpu_damage.py).
Integer adds, shifts and masks are kept as written, by eager PyTorch and by every compiler alike.

Both functions round to nearest, ties to even, as the casts do, for every float32 input: zeros and signs,
subnormals, overflow to infinity, infinities and NaN (tests/probe/test_damage_rounding.py checks them against
the casts on every exponent).
"""

from __future__ import annotations

import torch
from torch import Tensor

_BF16_DROPPED = 16  # float32 keeps 23 mantissa bits, BF16 7
_FP16_DROPPED = 13  # FP16 keeps 10
_FP16_MAX = 65504.0
_FP16_MIN_NORMAL = 2.0**-14
_FP16_SUBNORMAL_QUANTUM = 2.0**-24


def _round_mantissa(x: Tensor, dropped: int) -> Tensor:
    """``x`` (float32) with its lowest ``dropped`` mantissa bits rounded off, to nearest, ties to even; a carry
    runs into the exponent as it should (up to infinity). NaN stays NaN."""
    bits = x.view(torch.int32)
    half_less_one = (1 << (dropped - 1)) - 1
    odd = (bits >> dropped) & 1  # ties go to the even neighbour: add one more when the kept part is odd
    rounded = ((bits + half_less_one + odd) & -(1 << dropped)).view(torch.float32)
    return torch.where(torch.isnan(x), x, rounded)


def round_to_bf16(x: Tensor) -> Tensor:
    """float32 ``x`` as ``x.to(torch.bfloat16).float()`` gives it (BF16 has float32's exponent range)."""
    return _round_mantissa(x, _BF16_DROPPED)


def round_to_fp16(x: Tensor) -> Tensor:
    """float32 ``x`` as ``x.to(torch.float16).float()`` gives it: 10 mantissa bits where FP16 is normal, multiples
    of 2**-24 below 2**-14 (its subnormals), infinity beyond its largest finite value, 65504."""
    normal = _round_mantissa(x, _FP16_DROPPED)
    normal = torch.where(normal.abs() > _FP16_MAX, normal * float("inf"), normal)
    # x * 2**24 is exact (a power of two), and torch.round rounds halves to even
    subnormal = torch.round(x * (1 / _FP16_SUBNORMAL_QUANTUM)) * _FP16_SUBNORMAL_QUANTUM
    return torch.where(x.abs() < _FP16_MIN_NORMAL, subnormal, normal)
