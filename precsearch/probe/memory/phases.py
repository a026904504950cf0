"""CUDA memory by phase of the probe's steps: the peak inside each phase and what stays allocated after it.

The probe's whole peak (``ProbeResult.peak_memory_bytes``) is what ``max_memory_allocated`` would give
over the run; per-phase peaks need the counter reset between phases, so :class:`PhaseMemory` keeps the
running maximum itself. Phases: ``start`` (before the forward: parameters and optimizer state),
``forward`` (its end: plus the tensors saved for the backward), ``backward`` (gradients, after clipping)
and ``step`` (the optimizer step, gradients still alive). On a CPU it records nothing.

Bytes the process holds on the device outside the probe for the whole of it (``held``: the fixed-state
reader's BF16 side) are taken off every figure, so that they are the probe's own.
"""

from __future__ import annotations

from typing import Any

import torch

PHASES = ("start", "forward", "backward", "step")


class PhaseMemory:
    """Per-phase peak and resident bytes over the steps (the maximum over steps for each phase)."""

    def __init__(self, device: torch.device, held: int = 0):
        self.on = device.type == "cuda"
        self.device = device
        self.held = held
        self.peak: dict[str, int] = {}
        self.resident: dict[str, int] = {}
        self.overall = 0

    def mark(self, phase: str) -> None:
        """End ``phase``: note its peak and what is allocated now, then start counting the next phase."""
        if not self.on:
            return
        peak = torch.cuda.max_memory_allocated(self.device) - self.held
        self.overall = max(self.overall, peak)
        self.peak[phase] = max(self.peak.get(phase, 0), peak)
        self.resident[phase] = max(self.resident.get(phase, 0), torch.cuda.memory_allocated(self.device) - self.held)
        torch.cuda.reset_peak_memory_stats(self.device)

    def overall_peak(self) -> int:
        """The run's peak so far (as one ``max_memory_allocated`` without resets would read)."""
        return max(self.overall, torch.cuda.max_memory_allocated(self.device) - self.held) if self.on else 0

    def to_dict(self) -> dict[str, Any]:
        """``peak``/``resident`` by phase and the measured parts they imply (bytes; empty on a CPU)."""
        if not self.resident:
            return {}
        r = self.resident
        parts = {"weights_and_optimizer_state": r.get("start", 0),
                 "saved_activations": r.get("forward", 0) - r.get("start", 0),
                 "gradients": r.get("backward", 0) - r.get("start", 0)}
        return {"peak": dict(self.peak), "resident": dict(r), "parts": parts}
