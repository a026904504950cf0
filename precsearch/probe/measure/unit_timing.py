"""Per-unit GEMM time: forward and backward of each precision unit, timed inside a training step.

Hooks on each unit module mark the start and end of its forward
(``register_forward_pre_hook`` / ``register_forward_hook``) and its backward
(``register_full_backward_pre_hook`` / ``register_full_backward_hook``); a
unit's time is the sum of both spans, the median over the timed steps. On a GPU
the marks are CUDA events (kernel time on the stream); on a CPU they are wall
clock, and with the emulated backend they time the emulation, not FP8 hardware:
there the sensitivity table's speed column stays a FLOP-share prediction. The
model is whatever :func:`precsearch.probe.runner.build_probe` built, so on the
H200 the times are Transformer Engine's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn


class _Mark:
    """A point in time: a recorded CUDA event, or the CPU clock."""

    def __init__(self, cuda: bool):
        self.event = torch.cuda.Event(enable_timing=True) if cuda else None
        if self.event is not None:
            self.event.record()
        self.t = time.perf_counter()

    def ms_until(self, later: "_Mark") -> float:
        return self.event.elapsed_time(later.event) if self.event is not None else 1e3 * (later.t - self.t)


def timed_module(model: nn.Module, unit: str) -> str:
    """The submodule that runs ``unit``'s GEMM: the unit itself, or the fused module it is part of.

    The TE stack fuses a block's fc1 and fc2 into one ``te.LayerNormMLP`` (``mlp.layernorm_mlp``) when they
    share a precision, so those two units are one module there and can only be timed together.
    """
    try:
        model.get_submodule(unit)
        return unit
    except AttributeError:
        parent, _, leaf = unit.rpartition(".")
        fused = f"{parent}.layernorm_mlp"
        if leaf in ("linear_fc1", "linear_fc2"):
            try:
                model.get_submodule(fused)
                return fused
            except AttributeError:
                pass
        raise


def time_units(model: nn.Module, units: list[str], step: Callable[[], None], *, warmup: int = 3,
               repeats: int = 10) -> dict[str, float]:
    """Unit -> median milliseconds of its forward plus backward over ``repeats`` calls of ``step``.

    Units fused into one module (:func:`timed_module`) each report that module's time.
    """
    cuda = next(model.parameters()).is_cuda
    for _ in range(warmup):
        step()
    modules = {u: timed_module(model, u) for u in units}
    spans: dict[str, list[list[_Mark]]] = {m: [] for m in dict.fromkeys(modules.values())}
    handles = [h for m in spans for h in _hooks(model.get_submodule(m), spans[m], cuda)]
    try:
        for _ in range(repeats):
            step()
        if cuda:
            torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    per_span = {m: [a.ms_until(b) for a, b in s] for m, s in spans.items()}
    # two spans (forward, backward) per step
    per_module = {m: statistics.median(v[i] + v[i + 1] for i in range(0, len(v) - 1, 2)) for m, v in per_span.items()}
    return {u: per_module[m] for u, m in modules.items()}


def _hooks(module: nn.Module, spans: list[list[_Mark]], cuda: bool) -> list:
    def start(*_):
        spans.append([_Mark(cuda)])

    def stop(*_):
        spans[-1].append(_Mark(cuda))

    return [module.register_forward_pre_hook(lambda m, a: start()),
            module.register_forward_hook(lambda m, a, o: stop()),
            module.register_full_backward_pre_hook(lambda m, g: start()),
            module.register_full_backward_hook(lambda m, gi, go: stop())]
