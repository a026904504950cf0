"""Non-finite values anywhere in a probe: the loss, a gradient, an optimizer state, a weight.

A NaN or inf that training makes does not always reach the loss. The moment of an embedding row whose token
the data no longer holds shrinks every step; when its FP8 scale overflowed (issue 54, ``FP8StateAdamW`` after
~1,000 steps) the moment and then the row's weight became NaN, and a row no batch reads leaves the loss
finite. So a probe watches every tensor a step touches, and the first non-finite one found makes the probe
diverged at that step, named (:class:`NonFinite`), and the trial infeasible (:mod:`precsearch.search.scoring`):

* **the loss and the gradients**, every step, at no extra cost: the gradient norm the clip computes is a
  reduction over every gradient, non-finite when some gradient is (or when a finite sum of squares
  overflows: then no gradient is named, the ``gradient norm`` is). Only then are the gradients scanned
  for the first, in parameter order; the clip leaves them unscaled for that
  (:func:`precsearch.probe.runner.clip_unless_nonfinite`).
* **the optimizer states and the weights**, after every optimizer step: one fused norm over all of them
  (:func:`torch.nn.utils.get_total_norm`, a few kernels and one host sync; an FP8 moment, which no norm
  kernel takes, is tested on its bits), and, only when that is not finite, a scan that names the first.
  The states (each key: moments, their ``scale_inv``, a master copy) come before the weight of each
  parameter: AdamW computes the weight from them, so a NaN moment makes its weight NaN in the same step,
  and the moment is the cause.

When the loss or a gradient is found non-finite the states and weights are scanned too (they were
checked after the previous step, so a hit there is one made between the checks). A probe spread over
processes (FSDP2, tensor parallelism) checks each process's shards and agrees on the first finding in
rank order (``Parallel.first``), so every process stops at the same step. Integer states are not read:
the remainder bits of a master kept as remainders hold no value of their own, and TE ``FusedAdam``'s FP8
moments, kept as ``uint8``, do not say which FP8 format their bytes are (their FP32 scales are read).

Cost: the state and weight check reads every state and weight once a step. On an H100 at the 8B width (4 blocks,
``search_spaces/llama3_8b_h100_accelerate.yaml``, 2026-12-07) it took 11.7 ms of a 92 ms BF16 step (FP32 master
and moments) and 17.3 ms of a 78 ms FP8 one (remainders and ``fp8_block`` moments); on the CPU quickstart probe
1.8 ms, 2.0% of a BF16 step (``bench_nonfinite.py@6f05340``). It runs every step, **outside the timed step**:
the probe stops its clock (after a device synchronize) when the step's training is done and checks after, so
tokens/s and speed-up are the training's, as a framework runs it. Inside, it took that FP8 policy's speed-up
from 1.18x to 1.04x. It reads every tensor with one host sync in all: the FP8 bits are tested slice by slice into
a flag on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

#: Per FP8 storage dtype, ``(mask, value)``: a byte is non-finite when ``byte & mask == value`` (E4M3FN's only
#: NaN is S.1111.111; E5M2's exponent 11111 is inf or NaN; the ``fnuz`` formats' NaN is the negative zero).
_FP8_NONFINITE = {torch.float8_e4m3fn: (0x7F, 0x7F), torch.float8_e5m2: (0x7C, 0x7C),
                  torch.float8_e4m3fnuz: (0xFF, 0x80), torch.float8_e5m2fnuz: (0xFF, 0x80)}

#: Elements of an FP8 tensor tested at once.
_SLICE = 2**24

#: Combines each process's finding (a tensor name, or None) into the first one in rank order; one process: itself.
Agree = Callable[[str | None], str | None]


@dataclass(frozen=True)
class NonFinite:
    """The first non-finite value of a probe or a fixed-state reading.

    Attributes:
        step: The training step it was found at (of a reading: the step of the state read).
        tensor: What held it: ``loss``, ``gradient norm`` (a norm that overflowed with finite gradients),
            ``NAME grad``, ``NAME KEY`` (an optimizer state: ``exp_avg``, ``exp_avg_sq_scale_inv``, ...) or
            ``NAME`` (the weight), NAME a parameter's name; of a reading ``UNIT.weight gradient`` or
            ``UNIT.weight update`` (the policy's), or ``held-out loss``.
        state: For a reading, the index of the state (in ``objectives.damage.states`` order); else None.
    """

    step: int
    tensor: str
    state: int | None = None

    def describe(self) -> str:
        """``non-finite at step 12 in decoder.layers.1.mlp.linear_fc1.weight exp_avg_sq`` (a reading: ``at state
        1 (step 30)``)."""
        at = f"state {self.state} (step {self.step})" if self.state is not None else f"step {self.step}"
        return f"non-finite at {at} in {self.tensor}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NonFinite":
        return cls(**data)


def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: this process's shard


def is_nonfinite(t: Tensor) -> bool:
    """Whether ``t`` holds a NaN or an inf (an FP8 tensor by its bits, an FP8 weight of TE or torchao
    dequantized; integer tensors never)."""
    flag = _nonfinite_flag(t)
    return flag is not None and bool(flag)


def _nonfinite_flag(t: Tensor) -> Tensor | None:
    """A one-element bool tensor on ``t``'s device, True when ``t`` holds a NaN or an inf, read without a host
    sync (None for a tensor that cannot hold one: integers). An FP8 tensor is tested on its bits in slices, so the
    test's temporaries stay small beside a large moment; a sync per slice cost an 8B-width probe a host round trip
    for every 16M elements of every FP8 moment, each step."""
    t = _local(t).detach()
    if type(t) is not Tensor and hasattr(t, "dequantize"):  # one weight's copy at a time
        t = t.dequantize()
    if t.dtype in _FP8_NONFINITE:
        mask, value = _FP8_NONFINITE[t.dtype]
        flat = t.reshape(-1).view(torch.uint8)
        flag = torch.zeros((), dtype=torch.bool, device=t.device)
        for i in range(0, flat.numel(), _SLICE):
            flag |= ((flat[i:i + _SLICE] & mask) == value).any()
        return flag
    if not (t.is_floating_point() or t.is_complex()):
        return None
    return ~torch.isfinite(t).all()


def _all_finite(tensors: list[Tensor]) -> bool:
    """True when none of ``tensors`` is non-finite, read in one fused pass and one host sync; False may also be an
    overflow of the norm (huge finite values), which the naming scan then rules out."""
    plain = [t for t in tensors if type(t) is Tensor and t.dtype not in _FP8_NONFINITE]
    floats = [t for t in plain if t.is_floating_point() and t.numel()]
    flags = [f for t in tensors if type(t) is not Tensor or t.dtype in _FP8_NONFINITE
             if (f := _nonfinite_flag(t)) is not None]
    if floats:
        flags.append(~torch.isfinite(torch.nn.utils.get_total_norm(floats)))
    if not flags:
        return True
    devices = {f.device for f in flags}
    return not bool(torch.stack([f.to(next(iter(devices))) for f in flags]).any())


def named_grads(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(NAME grad, gradient)`` of every parameter that has one, in parameter order."""
    for name, p in model.named_parameters():
        if p.grad is not None:
            yield f"{name} grad", _local(p.grad).detach()


def named_update_tensors(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[tuple[str, Tensor]]:
    """Per parameter, in parameter order: its optimizer state tensors (``NAME KEY``), then the weight (``NAME``)."""
    for name, p in model.named_parameters():
        for key, value in opt.state.get(p, {}).items():
            if isinstance(value, Tensor):
                yield f"{name} {key}", _local(value).detach()
        yield name, _local(p).detach()


def first_nonfinite(named: Iterator[tuple[str, Tensor]]) -> str | None:
    """The name of the first non-finite tensor of ``named``, or None."""
    return next((name for name, t in named if is_nonfinite(t)), None)


def _alone(found: str | None) -> str | None:
    return found


class NonFiniteWatch:
    """Finds the first non-finite tensor of a probe's training (see the module docstring).

    Every process of a probe calls the same methods at the same steps (each may call ``agree``, a collective).
    """

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, agree: Agree = _alone):
        self.model, self.opt, self.agree = model, opt, agree
        self.found: NonFinite | None = None
        self._grad: str | None = None

    def after_update(self, step: int) -> None:
        """After the optimizer step of ``step``: the states and weights, one fused pass (named only if one is bad)."""
        tensors = [t for _, t in named_update_tensors(self.model, self.opt)]
        mine = None if _all_finite(tensors) else first_nonfinite(named_update_tensors(self.model, self.opt))
        if (name := self.agree(mine)) is not None:
            self.found = NonFinite(step, name)

    def gradients(self) -> None:
        """When the gradient norm is not finite (on every process), before the gradients are freed: the first
        non-finite gradient, kept for :meth:`stopped`."""
        self._grad = self.agree(first_nonfinite(named_grads(self.model)))

    def stopped(self, step: int, loss_finite: bool) -> NonFinite:
        """The finding of a step whose loss or gradient norm was not finite: a state or weight made non-finite
        since the last check, else the loss, else the first gradient (:meth:`gradients`), else the norm."""
        state = self.agree(first_nonfinite(named_update_tensors(self.model, self.opt)))
        name = state or ("loss" if not loss_finite else self._grad or "gradient norm")
        self.found, self._grad = NonFinite(step, name), None
        return self.found
