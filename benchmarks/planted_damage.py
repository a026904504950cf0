"""Damage planted at a known, graded severity for the stability judge (``bench_fidelity.py --judge``).

A real recipe's damage is whatever it is; a judge also needs policies whose damage is known to grow, so
that a long-run truth has something to decide and a reading something to rank. Here every GEMM operand
of the units a policy assigns FP8 current scaling (the forward's input and weight, the backward's output
gradient) is rounded to ``bits`` mantissa bits, round-to-nearest, keeping its exponent: FP8's rounding
without its range limits or scales. The relative rounding error is at most 1 / (2^(bits+1) + 1), so each
bit fewer about doubles it: 1/17 at 3 bits (E4M3's mantissa), 1/3 at 0 bits (powers of two). The rounding is straight-through
for autograd except the output gradient's, which is rounded on its way back, as a quantized GEMM does.

Used by name as a case's backend, ``mantissa:<bits>`` (:func:`backend`); it is the emulated backend with
that change, so it runs on any device.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from precsearch.backends import get_backend
from precsearch.backends.base import Backend, keep_input_norm, linear_modules, norm_input
from precsearch.backends.emulated import EmulatedBackend
from precsearch.precision import Precision

PREFIX = "mantissa:"


def round_mantissa(x: Tensor, bits: int) -> Tensor:
    """``x`` with ``bits`` explicit mantissa bits, round to nearest, the exponent kept (zeros stay 0)."""
    mantissa, exponent = torch.frexp(x.float())  # mantissa in [0.5, 1)
    steps = 2.0 ** (bits + 1)
    return torch.ldexp(torch.round(mantissa * steps) / steps, exponent).to(x.dtype)


class _RoundGradient(torch.autograd.Function):
    """Identity forward; the gradient rounded to ``bits`` mantissa bits on the way back."""

    @staticmethod
    def forward(ctx, x: Tensor, bits: int) -> Tensor:
        ctx.bits = bits
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return round_mantissa(grad, ctx.bits), None


class RoundedLinear(nn.Module):
    """A probe Linear whose GEMM operands are rounded to ``bits`` mantissa bits (see the module docstring)."""

    def __init__(self, linear: nn.Linear, bits: int):
        super().__init__()
        self.weight, self.bias, self.bits = linear.weight, linear.bias, bits
        keep_input_norm(self, linear)

    def forward(self, x: Tensor) -> Tensor:
        x = norm_input(self, x)
        qx = x + (round_mantissa(x, self.bits) - x).detach()
        qw = self.weight + (round_mantissa(self.weight, self.bits) - self.weight).detach()
        y = nn.functional.linear(qx, qw.to(qx.dtype), None if self.bias is None else self.bias.to(qx.dtype))
        return _RoundGradient.apply(y, self.bits)


class MantissaBackend(EmulatedBackend):
    """The emulated backend, but units assigned FP8 current scaling run at ``bits`` mantissa bits instead."""

    def __init__(self, bits: int):
        super().__init__()
        if not 0 <= bits <= 7:
            raise ValueError(f"mantissa bits {bits}; valid: 0 to 7")
        self.bits = bits

    def convert(self, model: nn.Module, recipes) -> nn.Module:
        linears = linear_modules(model, list(recipes))
        for name, recipe in recipes.items():
            if recipe.precision is Precision.FP8_CURRENT:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, RoundedLinear(linears[name], self.bits))
            elif recipe.precision is not Precision.BF16:
                raise ValueError(f"{name}: {recipe.precision.value}; a {PREFIX}<bits> case plants its damage "
                                 f"through units assigned fp8_current, and keeps the rest BF16")
        return model


def backend(name: str, device: torch.device) -> Backend:
    """The backend a judge case names: ``mantissa:<bits>`` here, any other name from the registry."""
    if name.startswith(PREFIX):
        return MantissaBackend(int(name[len(PREFIX):]))
    return get_backend(name, device)
