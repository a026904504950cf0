"""The fixed-state reading's compare step written plainly, as it was before it streamed: whole tensors, one
AdamW update per batch, pairwise float64 dots. The reference ``tests/probe/test_damage_chunked.py`` holds the
streaming code to (bit for bit up to float64 summation order; ``benchmarks/bench_damage_compare.py@6f05340`` timed
the two); written apart from :mod:`precsearch.probe.damage`, which it must not import.
"""

from __future__ import annotations

import torch

from precsearch.fp8.formats import fp8_max, quantize_dequantize
from precsearch.policy import MemoryKnobs


def stored(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """``x`` kept in ``dtype`` storage; FP16 and FP8 with one scale from the whole tensor's amax (finite for
    zeros, which stay zeros)."""
    if dtype == "fp32":
        return x
    if dtype == "bf16":
        return x.to(torch.bfloat16).float()
    amax = x.abs().max().clamp(min=torch.finfo(torch.float32).tiny)
    biggest = torch.finfo(torch.float32).max
    if dtype == "fp16":
        scale = (torch.finfo(torch.float16).max / 2 / amax).clamp(max=biggest)
        return (x * scale).to(torch.float16).float() / scale
    if dtype == "fp8":
        return quantize_dequantize(x, (fp8_max("e4m3") / amax).clamp(max=biggest), "e4m3")
    raise ValueError(dtype)


def adam(weight, grad, exp_avg, exp_avg_sq, step, lr, betas, weight_decay, eps=1e-8):
    """AdamW's change to ``weight`` at 0-based ``step`` (decoupled decay, bias-corrected)."""
    b1, b2 = betas
    t = step + 1
    m = b1 * exp_avg + (1 - b1) * grad
    v = b2 * exp_avg_sq + (1 - b2) * grad * grad
    return -lr * (m / (1 - b1**t) / ((v / (1 - b2**t)).sqrt() + eps) + weight_decay * weight)


def keep(knobs: MemoryKnobs, param_dtype: str) -> str:
    """The dtype updates accumulate in: the master's, the parameter's without one, FP32 for remainders."""
    if knobs.master == "none":
        return param_dtype
    return "fp32" if knobs.master == "remainders" else knobs.master


def applied(weight, grad, moments, step, lr, betas, weight_decay, knobs: MemoryKnobs, param_dtype: str):
    """The change the policy's step makes to the value it keeps."""
    first, second = knobs.moment_dtypes(param_dtype)
    update = adam(weight, grad.float(), stored(moments[0], first), stored(moments[1], second), step, lr, betas,
                  weight_decay)
    kept = keep(knobs, param_dtype)
    if kept == "fp32":
        return update
    before = stored(weight, kept)
    return stored(before + update, kept) - before


def pairwise_gram(vectors: list[torch.Tensor]) -> torch.Tensor:
    """The float64 Gram matrix, one dot product per pair."""
    k = len(vectors)
    out = torch.zeros(k, k, dtype=torch.float64)
    flat = [v.reshape(-1) for v in vectors]
    for i in range(k):
        a = flat[i].double()
        for j in range(i, k):
            out[i, j] = out[j, i] = float(a @ flat[j].double())
    return out
