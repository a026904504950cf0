"""What exporting a trial to a framework changes, and what that costs in memory (``precsearch export``).

The export package says what the framework runs of its files (:mod:`precsearch.export.as_run`); this
module, which may use the probe, predicts the peak of that and of the trial's own policy with the memory
model (:func:`~precsearch.probe.memory.peak.predict_peak`) at the target model (``n_layers`` blocks) under
the study's probe set-up (sequence length, micro-batch, parameter dtype, gradient accumulation), against
the BF16 baseline predicted alike (the reference run's set-up, ``objectives.baseline_memory``). Both sides use the same model, so the difference is the policy's
change alone; the framework's own step (Megatron's gradient buffer, torchao's saved tensors:
:mod:`precsearch.probe.memory.frameworks`) is not in it. Speed is not predicted: the trial's tokens/s
were measured on the policy as searched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from precsearch.config.space import ModelSection, ProbeSection, stored_baseline_knobs
from precsearch.export.as_run import AsRun, describe_changes
from precsearch.probe.memory.peak import predict_peak

_GIB = 2 ** 30


def gib(n_bytes: float, sign: str = "") -> str:
    """Bytes in GiB: two decimals, or three significant digits below 0.1 GiB (a small model's)."""
    value = n_bytes / _GIB
    return f"{value:{sign}.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:{sign}.3g}"


@dataclass(frozen=True)
class ExportCost:
    """Predicted peaks (bytes) at the target model: the trial's policy, what is written, and BF16.

    Attributes:
        changes: What changes, one line each (:func:`~precsearch.export.as_run.describe_changes`).
        trial_bytes: The trial's policy as searched.
        written_bytes: What the framework runs of the written files.
        baseline_bytes: Every layer BF16, with the study's baseline memory knobs (``objectives.baseline_memory``).
        n_layers: Blocks of the model predicted for.
    """

    changes: list[str]
    trial_bytes: int
    written_bytes: int
    baseline_bytes: int
    n_layers: int

    def saved(self, peak: int) -> float:
        """``1 - peak / BF16 peak``."""
        return 1.0 - peak / self.baseline_bytes

    def summary(self) -> str:
        """The cost in one sentence: GiB and points of the BF16 baseline, written against the trial's."""
        delta = self.written_bytes - self.trial_bytes
        points = 100 * (self.saved(self.trial_bytes) - self.saved(self.written_bytes))
        return (f"{gib(delta, '+')} GiB ({points:+.2f} points of the BF16 baseline's "
                f"{gib(self.baseline_bytes)} GiB): {gib(self.written_bytes)} GiB as written against "
                f"{gib(self.trial_bytes)} GiB for the trial's policy, memory_saved "
                f"{self.saved(self.written_bytes):.4f} against {self.saved(self.trial_bytes):.4f} (predicted by "
                f"the memory model, {self.n_layers}-layer target model); speed not predicted")

    def figures(self) -> dict[str, Any]:
        """What the files' headers state (``provenance["as_written"]``: plain numbers and strings)."""
        return {"changed": bool(self.changes), "n_layers": self.n_layers,
                "memory_saved": _sig(self.saved(self.written_bytes)),
                "peak_gib": _sig(self.written_bytes / _GIB),
                "trial_memory_saved_predicted": _sig(self.saved(self.trial_bytes)),
                "trial_peak_gib": _sig(self.trial_bytes / _GIB),
                "baseline_peak_gib": _sig(self.baseline_bytes / _GIB),
                "speed": "not predicted"}


def _sig(value: float) -> float:
    """Six significant digits: what a header shows, for a small model as for the 8B."""
    return float(f"{value:.6g}")


def export_cost(space: dict[str, Any], trial: AsRun, written: AsRun, n_layers: int) -> ExportCost:
    """The changes from ``trial`` to ``written`` and their predicted peaks, for the study's ``space`` (as stored)."""
    cfg = replace(ModelSection(**space["model"]).target(), n_layers=n_layers)
    probe = ProbeSection(**space["probe"])

    def peak(run: AsRun) -> int:
        return predict_peak(cfg, run.precisions, seq_len=probe.seq_len, micro_batch=probe.micro_batch,
                            param_dtype=probe.param_dtype, memory=run.memory, grad_accum=probe.grad_accum).total

    baseline = AsRun({}, stored_baseline_knobs(space))
    return ExportCost(describe_changes(trial, written, probe.param_dtype), peak(trial), peak(written),
                      peak(baseline), n_layers)


__all__ = ["ExportCost", "export_cost", "gib"]
