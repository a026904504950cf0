"""What one probe run produced."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ProbeResult:
    """Per-step records and end-of-probe measurements of one probe run.

    Attributes:
        losses: Training loss per step run (NaN where non-finite).
        grad_norms: Global gradient norm per step, before clipping.
        fp8_steps: Per step, whether FP8 was on (False during the BF16 warm-up).
        eval_loss: Mean loss on the fixed held-out batches after training (NaN if diverged).
        diverged: The probe stopped early: a non-finite value (loss, gradient, optimizer state, weight) or a
            loss blow-up.
        diverged_step: The step it stopped at, if it did.
        events: Unusual steps as ``{step, kind, value, baseline}`` dicts, in step order: loss
            spikes, gradient-norm blow-ups and non-finite values (see :mod:`precsearch.probe.measure.events`).
        reason: Why it stopped, in words ("" if it did not).
        nonfinite: The first non-finite value, as ``{step, tensor, state}``
            (:class:`~precsearch.probe.measure.nonfinite.NonFinite`), or None: none was found.
        tokens_per_s: Training throughput over the FP8 steps (median step time).
        tokens_per_s_rel_se: Its relative standard error over those steps
            (:func:`~precsearch.probe.measure.step_rate.step_rate`; NaN with too few steps, or stored before).
        peak_memory_bytes: Peak training memory (of the busiest process when the probe spans several).
        per_rank_peak_bytes: Peak memory of each process of a probe that spans several (FSDP2),
            in rank order, measured or predicted as ``memory_source`` says; empty for one process.
        memory_source: "measured" (torch.cuda.max_memory_allocated) or "predicted" (memory model).
        predicted_memory: The memory model's breakdown (always present).
        target_memory_bytes: Peak memory of the *target* model (``target_layers`` blocks, the
            probe's sequence length, micro-batch and policy) from the memory model, corrected by
            this probe's own measurement when it ran on a GPU (:mod:`precsearch.probe.memory.calibration`).
        target_memory_source: "calibrated" (corrected by a measurement) or "predicted".
        target_layers: Blocks of the model ``target_memory_bytes`` is for.
        memory_calibration: The correction applied (:class:`~precsearch.probe.memory.calibration.Calibration`).
        target_breakdown: The memory model's uncorrected components for the target
            (:meth:`~precsearch.probe.memory.peak.MemoryBreakdown.components`: weights, FP8 weight copies,
            master weights, moments, gradients, activations, logits, step transient), bytes.
        memory_phases: On a GPU, the peak and resident bytes by step phase
            (:class:`~precsearch.probe.memory.phases.PhaseMemory`); empty on a CPU.
        wall_s: Wall time of the whole probe, build included.
        device: Where it ran.
        card: The GPU's name (``torch.cuda.get_device_name``) where it ran on one; "" on a CPU or where stored
            before precsearch recorded it. :mod:`precsearch.probe.framework_step` reads it.
        layer_stats: Per-layer FP8 statistics, one ``{step, layer, role, precision, amax, scale,
            overflow, underflow, nonfinite}`` dict per FP8 layer and tensor role at each
            collection step (see :mod:`precsearch.probe.measure.diagnostics`).
        first_bad: For a diverged probe, the first layer that went bad as ``{step, layer, tensor,
            kind, value}`` (:class:`~precsearch.probe.measure.diagnostics.FirstBad`), or None.
        phase_s: Seconds spent per phase: build (model, conversion, optimizer), bf16_steps or
            warmup_steps and fp8_steps (the training loop), eval.
        optimizer_step_s: Median seconds of the optimizer step (the update and zeroing the gradients) over
            the steps timed for ``tokens_per_s``, on a GPU after a device synchronize; NaN where none was
            timed. A framework's optimizer step differs from the probe's (docs/frameworks.md, "Megatron
            again"): this is the probe's side of that difference.
        signals: The early-warning signals of the steps this process ran
            (:meth:`precsearch.probe.measure.signals.Signals.to_dict`), or None.
        start_step: The first step this process ran: 0, or the step a continued run took up
            from its checkpoint (:mod:`precsearch.probe.continuation`); the per-step records
            cover the whole run from step 0 either way.
        damage: The fixed-state damage reading of the trial's policy
            (:func:`precsearch.probe.damage.reading_dict`), or None where none was read.
    """

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    fp8_steps: list[bool] = field(default_factory=list)
    eval_loss: float = float("nan")
    diverged: bool = False
    diverged_step: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    nonfinite: dict[str, Any] | None = None
    tokens_per_s: float = 0.0
    tokens_per_s_rel_se: float = math.nan
    peak_memory_bytes: int = 0
    per_rank_peak_bytes: list[int] = field(default_factory=list)
    memory_source: str = "predicted"
    predicted_memory: dict[str, int] = field(default_factory=dict)
    target_memory_bytes: int = 0
    target_memory_source: str = "predicted"
    target_layers: int = 0
    memory_calibration: dict[str, Any] = field(default_factory=dict)
    target_breakdown: dict[str, int] = field(default_factory=dict)
    memory_phases: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    device: str = "cpu"
    card: str = ""
    phase_s: dict[str, float] = field(default_factory=dict)
    optimizer_step_s: float = math.nan
    layer_stats: list[dict[str, Any]] = field(default_factory=list)
    first_bad: dict[str, Any] | None = None
    start_step: int = 0
    signals: dict[str, Any] | None = None
    damage: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ProbeResult":
        return cls(**data)
