"""BF16 Linear layers on a CPU: BF16 operands and results, float32 GEMMs.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` a Linear casts its input
and weight to BF16 and multiplies them with a BF16 GEMM. CPUs without BF16
dot-product instructions run that GEMM slower than a float32 one: AVX2-only
CPUs (e.g. AMD EPYC before Zen 4) in a generic kernel, where a BF16 step of the
quickstart's probe took 3-4x as long as an emulated-FP8 step (whose GEMMs are
float32), AVX-512 CPUs without AVX512_BF16 in oneDNN's emulation (about 1.5x
the float32 step). ``bench_cpu_step.py@9f51ce4`` measures it.

:func:`linear` computes the same thing with float32 GEMMs: it rounds the
operands to BF16 exactly as autocast does, multiplies them in float32 (the
product of two BF16 numbers is exact in float32, and a BF16 GEMM accumulates in
float32 too) and rounds the result to BF16; the backward does the same for the
input and weight gradients, which autocast also returns in BF16. What differs
from a native BF16 GEMM is only the order of the float32 sums, i.e. an
occasional last-bit difference after the BF16 rounding. It saves the same
BF16 tensors for the backward, so memory is unchanged.

CPUs with BF16 dot products (AVX512_BF16 or AMX, e.g. AMD Zen 4, Intel
Sapphire Rapids) keep autocast's BF16 GEMM, which is faster there (quickstart
probe on a Zen 4, one thread: 0.09 against 0.13 s per BF16 step); so do GPUs. Which path a
CPU takes is part of a BF16 reference's cache key (:func:`gemm_path`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

BF16 = torch.bfloat16


@functools.cache
def native_bf16_gemms() -> bool:
    """Whether this CPU has BF16 dot-product instructions (AVX512_BF16 or AMX tiles) oneDNN can use."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def gemm_path() -> str:
    """How a CPU probe multiplies BF16 here: ``native-bf16`` or ``float32``."""
    return "native-bf16" if native_bf16_gemms() else "float32"


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; under CPU BF16 autocast without native BF16, float32 GEMMs on BF16 operands."""
    if x.device.type != "cpu" or not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") != BF16:
        return F.linear(x, weight, bias)
    if native_bf16_gemms():
        return F.linear(x, weight, bias)
    with torch.autocast("cpu", enabled=False):
        return _Bf16Linear.apply(x, weight, bias)


class _Bf16Linear(torch.autograd.Function):
    """y = bf16(x) @ bf16(w)^T (+ bf16(b)) in float32, rounded to BF16; gradients rounded to BF16 likewise."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        xb, wb = x.to(BF16), weight.to(BF16)
        out = xb.reshape(-1, xb.shape[-1]).float() @ wb.float().t()
        if bias is not None:
            out = out + bias.to(BF16).float()
        ctx.save_for_backward(xb, wb)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return out.to(BF16).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        xb, wb = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        # the incoming gradient is BF16 (the output was); each gradient is rounded to BF16, as the
        # BF16 GEMM returns it, then cast to its input's dtype, as autocast's cast backward does
        g = grad_out.to(BF16).reshape(-1, grad_out.shape[-1]).float()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = (g @ wb.float()).to(BF16).to(x_dtype).reshape(xb.shape)
        if ctx.needs_input_grad[1]:
            dw = (g.t() @ xb.reshape(-1, xb.shape[-1]).float()).to(BF16).to(w_dtype)
        if b_dtype is not None and ctx.needs_input_grad[2]:
            db = g.sum(0).to(BF16).to(b_dtype)
        return dx, dw, db
