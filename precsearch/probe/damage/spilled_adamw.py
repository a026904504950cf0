"""The BF16 run's AdamW with its moments on disk between steps (``keep_states: disk`` on a CPU).

The run to the reading's states is plain training (FP32 parameters, their gradients, two FP32 AdamW moments:
16 bytes a parameter), and on a CPU it was the reading's peak once nothing else was held (docs/stability-reading.md).
:class:`SpilledMomentsAdamW` is ``torch.optim.AdamW`` with the moments written to a :class:`.spill.SpillFile`
after each step, and a step taken one parameter at a time: that parameter's moments read back, its update
applied, the moments written again and its gradient freed. The largest parameters go first, so their gradients
are gone before the next moments are read; the step then holds the parameters, the gradients not yet applied and
one parameter's moments.

AdamW's update of a parameter reads only its own gradient and moments (and the group's scalars, the same for
each), and the CPU steps every parameter alone anyway (the single-tensor loop; a GPU's fused or foreach
kernels are not used here): so the run's weights and moments are those of ``torch.optim.AdamW`` over all
parameters at once, to the bit (``tests/probe/test_damage_disk.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from precsearch.probe.damage.spill import SpilledTensor, SpillFile

MOMENTS = ("exp_avg", "exp_avg_sq")


class SpilledMomentsAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (same arguments) whose moments are kept in ``spill`` between steps (module
    docstring). Only for host tensors and ``step()`` without a closure."""

    def __init__(self, params, spill: SpillFile, **kwargs):
        super().__init__(params, **kwargs)
        self.spill = spill
        self._on_disk: dict[torch.nn.Parameter, tuple[SpilledTensor, SpilledTensor]] = {}

    def spilled_moments(self, param: torch.nn.Parameter) -> tuple[SpilledTensor, SpilledTensor] | None:
        """``param``'s two moments on disk, unread (None before its first step)."""
        return self._on_disk.get(param)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("SpilledMomentsAdamW.step takes no closure (the reading's run passes none)")
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if any(p.device.type != "cpu" for p in params):
            raise ValueError("SpilledMomentsAdamW steps host parameters only (a GPU's AdamW is fused)")
        params.sort(key=lambda p: p.numel(), reverse=True)  # the largest gradients freed first
        grads = {p: p.grad for p in params}
        for p in params:
            p.grad = None
        for p in params:
            p.grad = grads.pop(p)
            state = self.state[p]
            kept = self._on_disk.get(p)
            if kept is not None:
                state.update(zip(MOMENTS, (t.load() for t in kept)))
            super().step()  # only p has a gradient: AdamW's own update of it
            moments = tuple(state.pop(name) for name in MOMENTS)
            self._on_disk[p] = tuple(self.spill.write(m, at=k) for m, k in
                                     zip(moments, kept or (None, None)))  # type: ignore[assignment]
            del moments
            p.grad = None
        return None


def moments_of(opt: torch.optim.Optimizer, param: torch.nn.Parameter) -> tuple[Tensor | SpilledTensor, ...] | None:
    """``param``'s two AdamW moments in ``opt``: tensors, or unread on disk for :class:`SpilledMomentsAdamW`;
    None before its first step."""
    if isinstance(opt, SpilledMomentsAdamW):
        return opt.spilled_moments(param)
    state = opt.state.get(param, {})
    return (state["exp_avg"], state["exp_avg_sq"]) if "exp_avg" in state else None
