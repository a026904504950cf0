"""The optimizer step at a fixed state, as the baseline takes it and as a policy's memory knobs take it.

The baseline (BF16 compute, FP32 master weights and AdamW moments) applies the
AdamW update exactly. A policy's memory knobs change two things about the step:

* **stored moments** (``moment_dtype`` / ``exp_avg_dtype`` / ``exp_avg_sq_dtype``
  BF16 or FP8): the moments the step starts from are the state's rounded to that
  storage (FP8: E4M3 with a per-tensor scale, as TE's ``FusedAdam`` keeps them),
  so the update is computed from rounded averages;
* **where the update lands**: with FP32 master weights (or TE's param
  remainders, the same FP32 values in two tensors) every update is kept. Without
  a master copy the update is added to the parameter in its own dtype and the
  part below its rounding quantum is lost (BF16 parameters: 8 significant bits);
  an FP16 master keeps it to FP16's quantum under a per-tensor scale.

:func:`applied_update` returns the change a step makes to the master value the
next forward reads from; its difference from :func:`baseline_update` on the same
gradient is the update error the knobs cause.
"""

from __future__ import annotations

import torch
from torch import Tensor

from precsearch.fp8.formats import fp8_max, quantize_dequantize
from precsearch.policy import MemoryKnobs


def stored(x: Tensor, dtype: str) -> Tensor:
    """``x`` as kept in ``dtype`` storage (``fp32``, ``bf16``, ``fp16`` with a per-tensor scale, ``fp8``)."""
    if dtype == "fp32":
        return x
    if dtype == "bf16":
        return x.to(torch.bfloat16).float()
    amax = x.abs().max().clamp(min=torch.finfo(torch.float32).tiny)
    if dtype == "fp16":  # scaled into FP16's range, as TE's FP16 master copies are
        scale = torch.finfo(torch.float16).max / 2 / amax
        return (x * scale).to(torch.float16).float() / scale
    if dtype == "fp8":
        return quantize_dequantize(x, fp8_max("e4m3") / amax, "e4m3")
    raise ValueError(f"unknown storage dtype {dtype!r}; valid: fp32, bf16, fp16, fp8")


def adam_update(weight: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: int, lr: float,
                betas: tuple[float, float], weight_decay: float, eps: float = 1e-8) -> Tensor:
    """The change AdamW (decoupled weight decay, bias-corrected) makes to ``weight`` at 0-based ``step``."""
    b1, b2 = betas
    t = step + 1
    m = b1 * exp_avg + (1 - b1) * grad
    v = b2 * exp_avg_sq + (1 - b2) * grad * grad
    denom = (v / (1 - b2**t)).sqrt() + eps
    return -lr * (m / (1 - b1**t) / denom + weight_decay * weight)


def baseline_update(weight: Tensor, grad: Tensor, moments: tuple[Tensor, Tensor], step: int, lr: float,
                    betas: tuple[float, float], weight_decay: float) -> Tensor:
    """The baseline's exact update (FP32 master weights and moments)."""
    return adam_update(weight, grad.float(), *moments, step, lr, betas, weight_decay)


def applied_update(weight: Tensor, grad: Tensor, moments: tuple[Tensor, Tensor], step: int, lr: float,
                   betas: tuple[float, float], weight_decay: float, knobs: MemoryKnobs, param_dtype: str) -> Tensor:
    """The change the policy's step makes to the value it keeps for ``weight`` (see the module docstring)."""
    first, second = knobs.moment_dtypes(param_dtype)
    exp_avg, exp_avg_sq = stored(moments[0], first), stored(moments[1], second)
    update = adam_update(weight, grad.float(), exp_avg, exp_avg_sq, step, lr, betas, weight_decay)
    keep = _master_storage(knobs, param_dtype)
    if keep == "fp32":
        return update
    before = stored(weight, keep)
    return stored(before + update, keep) - before


def _master_storage(knobs: MemoryKnobs, param_dtype: str) -> str:
    """The dtype the optimizer accumulates updates in: the master copy's, or the parameter's without one."""
    master = knobs.master
    if master == "none":
        return param_dtype
    return "fp32" if master == "remainders" else master
