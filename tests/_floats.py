"""float32 test values that reach every exponent and rounding boundary, and a bitwise comparison."""

import math

import torch


def every_exponent(n_per_exponent: int = 4096) -> torch.Tensor:
    """float32 values of every exponent (subnormals, infinities and NaNs included), both signs, with random
    mantissas and the ones next to each rounding boundary of BF16 and FP16 (ties, one below, one above)."""
    gen = torch.Generator().manual_seed(0)
    exponents = torch.arange(256, dtype=torch.int64).repeat_interleave(n_per_exponent)
    mantissas = torch.randint(0, 2**23, (exponents.numel(),), generator=gen, dtype=torch.int64)
    boundaries = []
    for dropped in (16, 13):
        kept = torch.randint(0, 2**(23 - dropped), (exponents.numel(),), generator=gen, dtype=torch.int64)
        tie = (kept << dropped) | (1 << (dropped - 1))
        boundaries += [tie, tie - 1, tie + 1, kept << dropped, (kept << dropped) | ((1 << dropped) - 1)]
    mantissa = torch.cat([mantissas, *[b & (2**23 - 1) for b in boundaries]])
    exponent = exponents.repeat(1 + len(boundaries))
    bits = (exponent << 23) | mantissa
    bits = torch.cat([bits, bits | (1 << 31)])  # both signs
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return bits.view(torch.float32)


def differing(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where ``a`` and ``b`` (float32) differ bit for bit; any two NaNs count as the same."""
    return ~((a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b)))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not bool(differing(a, b).any())


def same_values(a, b) -> bool:
    """Equal structures (dicts, lists, tuples), floats to the bit (NaN equal to NaN: a standard error over one
    held-out batch)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b
