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


def time_units(model: nn.Module, units: list[str], step: Callable[[], None], *, warmup: int = 3,
               repeats: int = 10) -> dict[str, float]:
    """Unit -> median milliseconds of its forward plus backward over ``repeats`` calls of ``step``."""
    cuda = next(model.parameters()).is_cuda
    for _ in range(warmup):
        step()
    spans: dict[str, list[list[_Mark]]] = {u: [] for u in units}
    handles = [h for u in units for h in _hooks(model.get_submodule(u), spans[u], cuda)]
    try:
        for _ in range(repeats):
            step()
        if cuda:
            torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    per_span = {u: [a.ms_until(b) for a, b in s] for u, s in spans.items()}
    # two spans (forward, backward) per step
    return {u: statistics.median(v[i] + v[i + 1] for i in range(0, len(v) - 1, 2)) for u, v in per_span.items()}


def _hooks(module: nn.Module, spans: list[list[_Mark]], cuda: bool) -> list:
    def start(*_):
        spans.append([_Mark(cuda)])

    def stop(*_):
        spans[-1].append(_Mark(cuda))

    return [module.register_forward_pre_hook(lambda m, a: start()),
            module.register_forward_hook(lambda m, a, o: stop()),
            module.register_full_backward_pre_hook(lambda m, g: start()),
            module.register_full_backward_hook(lambda m, gi, go: stop())]
