"""Reading trials at fixed states: the BF16 side computed once per gradient-clipping value, then each policy.

:class:`DamageReader` lives in the probe process beside the space's data and
backend (:class:`precsearch.runtime.probe_host.ProbeHost`): the BF16 run's
states and the BF16 gradients at them are computed the first time a trial with
a given clipping threshold is read and kept for the next trials, as the BF16
references are. A reading is returned as a plain dict (``ProbeResult.damage``)
so that it travels from the probe process and into the study's records.

With the states on disk (``keep_states: disk``, and ``auto`` on a CPU) the
states and the BF16 gradients are written to anonymous temporary files
(:mod:`.spill`) instead of being held, and a policy's gradients at a state go to
a file of their own, closed once that state is compared: between trials the
reader holds no tensor, and :meth:`DamageReader.close` frees the files. On a
CPU, with its states on disk, a reading fixes glibc's mmap threshold while it
runs (:mod:`precsearch.utils.host_heap`), so that what the BF16 run, the sides and
the compare free leaves the process instead of staying in its heaps.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from precsearch.arch.hf_checkpoint import CheckpointStart
from precsearch.backends.base import Backend
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import MemoryKnobs, Policy
from precsearch.probe.damage.placement import where_states
from precsearch.probe.damage.reading import Side, StateReading, measure_side, read_state, side_grams
from precsearch.probe.damage.spill import SpillFile, is_spilled
from precsearch.probe.damage.states import State, reference_states
from precsearch.probe.measure.nonfinite import NonFinite
from precsearch.probe.data import TokenBatches
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.model.reuse import ModelCache
from precsearch.utils import trace
from precsearch.utils.host_heap import freed_memory_returned


class DamageReader:
    """The fixed-state reading of one space's probe (see :mod:`precsearch.probe.damage.reading`)."""

    def __init__(self, cfg: ModelConfig, probe: ProbeSection, data: TokenBatches, backend: Backend,
                 device: torch.device, settings: DamageSection, init: CheckpointStart | None = None,
                 baseline: MemoryKnobs | None = None, models: ModelCache | None = None,
                 spill_dir: str | Path | None = None):
        self.cfg, self.probe, self.data, self.backend = cfg, probe, data, backend
        self.device, self.settings, self.init = device, settings, init
        self.baseline = baseline or MemoryKnobs()
        self.models = models  # the probe process's kept model: a trial's reading sets its weights to each state
        self.spill_dir = spill_dir  # where states kept on disk go (None: the temporary directory)
        self._bf16: dict[float | None, list[tuple[State, Side]]] = {}
        self._files: list[SpillFile] = []  # the BF16 sides' files on disk, one per clipping value
        self.states_on: dict[float | None, str] = {}  # clipping value -> "device", "host" or "disk"

    def bf16_sides(self, clip_grad: float | None) -> list[tuple[State, Side]]:
        """The states of the BF16 run with ``clip_grad`` and the BF16 side at each, with its own Gram matrices
        (computed once)."""
        if clip_grad not in self._bf16:
            with freed_memory_returned(self._returns_freed(clip_grad)):
                self._bf16[clip_grad] = self._make_sides(clip_grad)
        return self._bf16[clip_grad]

    def _make_sides(self, clip_grad: float | None) -> list[tuple[State, Side]]:
        """The BF16 run to its states (placed by :meth:`_where`) and the BF16 side at each."""
        if self.models is not None:
            self.models.clear()  # the BF16 run builds its own model: the kept one would only add to the peak
        at = self.settings.state_steps(self.probe.steps)
        where = self._where(len(at))
        self.states_on[clip_grad] = where
        spill = self._file() if where == "disk" else None
        with trace.span("reading: BF16 run"):  # the run to its states, kept on the device, page-locked or on disk
            states = reference_states(self.cfg, self.probe, self.data, self.device, clip_grad, at, self.init,
                                      keep_on_device=where == "device", spill=spill)
        reference = Policy.bf16(clip_grad, self.baseline)
        sides = []
        for state in states:
            with trace.span("reading: BF16 gradients"):
                side = self._side(state, reference, spill)
            with trace.span("reading: BF16 grams"):  # the first in a process compiles the compare step
                side.grams = side_grams(side, state, self.probe, self.settings, self.device)
                _synchronize(self.device)
            sides.append((state, side))
        return sides

    def device_bytes(self) -> int:
        """Bytes the reader keeps on an accelerator between trials: the BF16 sides' gradients, and the states'
        weights and moments when ``keep_states`` is ``device``. The probe process holds them while a trial runs,
        so a trial's measured peak must not count them (``run_probe``'s ``held_bytes``)."""
        return sum(t.numel() * t.element_size() for sides in self._bf16.values() for state, side in sides
                   for t in (*_state_tensors(state), *_grad_tensors(side)) if t.device.type != "cpu")

    def host_bytes(self) -> int:
        """Bytes of host memory the reader keeps between trials: the states and BF16 gradients it holds in
        memory on a CPU or page-locked (none of them when they are on disk)."""
        return sum(t.numel() * t.element_size() for sides in self._bf16.values() for state, side in sides
                   for t in (*_state_tensors(state), *_grad_tensors(side)) if t.device.type == "cpu")

    def disk_bytes(self) -> int:
        """Bytes the reader keeps on disk between trials (the states and BF16 gradients of ``keep_states: disk``)."""
        return sum(f.nbytes for f in self._files if not f.closed)

    def close(self) -> None:
        """Forget the BF16 sides and close their files on disk (the kernel frees them); a later reading makes
        its BF16 side again."""
        self._bf16.clear()
        for f in self._files:
            f.close()
        self._files.clear()

    def _where(self, n_states: int) -> str:
        """Where this clipping value's states go (:func:`.placement.where_states`)."""
        return where_states(self.cfg, self.probe, self.settings, self.device, n_states, self.device_bytes(),
                            self.spill_dir)

    def _file(self) -> SpillFile:
        """A new file for a clipping value's states and BF16 gradients, kept until :meth:`close`."""
        self._files.append(SpillFile(self.spill_dir))
        return self._files[-1]

    def _side(self, state: State, policy: Policy, spill: SpillFile | None = None) -> Side:
        return measure_side(self.cfg, self.probe, self.data, self.backend, self.device, state, policy,
                            self.settings, self.models, spill)

    def read(self, policy: Policy) -> dict[str, Any]:
        """``policy``'s reading: the chosen figure's largest value over the states, and every figure; with its
        time, and the time by part (``side``: building the policy's model at each state and its backward and
        held-out passes; ``compare``: the figures, with the AdamW updates and, for states kept on the host,
        their copies of the state to the device); where the states are kept (``states_on``: ``device``, ``host``
        or ``disk``); and ``bf16_side_s``, the seconds of the BF16 side made for this reading (0 when it was kept
        from an earlier one): the first reading of each clipping value pays it, which a per-trial rate must leave
        out."""
        with freed_memory_returned(self._returns_freed(policy.clip_grad)):
            return self._read(policy)

    def _returns_freed(self, clip_grad: float | None) -> bool:
        """Whether a reading with ``clip_grad`` returns the memory it frees (:mod:`precsearch.utils.host_heap`):
        on a CPU, with that clipping value's states on disk (or to be placed there)."""
        if self.device.type != "cpu":
            return False
        where = self.states_on.get(clip_grad) or self._where(len(self.settings.state_steps(self.probe.steps)))
        return where == "disk"

    def _read(self, policy: Policy) -> dict[str, Any]:
        start = time.perf_counter()
        clock = _Clock(self.device)
        states = []
        made = policy.clip_grad not in self._bf16
        with trace.span("reading: BF16 side"):  # the first trial of each clipping value only: its states
            sides = self.bf16_sides(policy.clip_grad)
        bf16_side_s = time.perf_counter() - start
        for state, bf16 in sides:
            # on disk, the policy's gradients at this state go to a file of their own, closed after the compare
            spill = SpillFile(self.spill_dir) if self.states_on[policy.clip_grad] == "disk" else None
            try:
                side = clock.timed("side", self._side, state, policy, spill)
                states.append(clock.timed("compare", read_state, bf16, side, state, policy, self.probe,
                                          self.settings, self.device))
                del side  # the policy's gradients at this state: not held while the next state's are computed
            finally:
                if spill is not None:
                    spill.close()
        return reading_dict(states, self.settings) | {"seconds": time.perf_counter() - start,
                                                      "seconds_by_part": clock.seconds,
                                                      "bf16_side_s": bf16_side_s if made else 0.0,
                                                      "states_on": self.states_on[policy.clip_grad]}


def reading_dict(states: list[StateReading], settings: DamageSection) -> dict[str, Any]:
    """The reading as ``ProbeResult.damage`` holds it (``value``: the worst state's ``settings.measure``;
    ``nonfinite``: the first state's non-finite tensor as ``{step, tensor, state}``, or None)."""
    measure = settings.measure
    worst = max(states, key=lambda s: _finite(s.total[measure][0]))
    bad = next((NonFinite(s.step, s.nonfinite, i).to_dict() for i, s in enumerate(states) if s.nonfinite), None)
    return {
        "measure": measure,
        "value": worst.total[measure][0],
        "se": worst.total[measure][1],
        "state_step": worst.step,
        "nonfinite": bad,
        "tokens_per_step": settings.tokens_per_step,
        "states": [{"step": s.step, "total": {k: list(v) for k, v in s.total.items()},
                    "units": {u: {k: list(v) for k, v in f.items()} for u, f in s.units.items()}}
                   for s in states],
    }


class _Clock:
    """Seconds by part, the device synchronised at each part's end (so a GPU's queued work is counted)."""

    def __init__(self, device: torch.device):
        self.device, self.seconds = device, {}

    def timed(self, part: str, fn, *args):
        t0 = time.perf_counter()
        with trace.span(f"reading: {part}"):  # the run's trace splits the reading the same way
            out = fn(*args)
            _synchronize(self.device)
        self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - t0
        return out


def _synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work, so that a span or a part ends when its GPU work does."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _state_tensors(state: State) -> list[torch.Tensor]:
    """A kept state's tensors in memory: every weight, and each unit's two moments (none on disk)."""
    weights = [] if is_spilled(state.weights) else list(state.weights.values())
    moments = [] if is_spilled(state.moments) else [m for pair in state.moments.values() for m in pair]
    return [*weights, *moments]


def _grad_tensors(side: Side) -> list[torch.Tensor]:
    """A kept BF16 side's tensors in memory: each unit's gradient on each batch (none on disk)."""
    return [t for batch in side.grads if not is_spilled(batch) for t in batch.values()]


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf
