"""What one probe run produced."""

from __future__ import annotations

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
        diverged: The probe stopped early: a non-finite loss/gradient or a loss blow-up.
        diverged_step: The step it stopped at, if it did.
        reason: Why it stopped, in words ("" if it did not).
        tokens_per_s: Training throughput over the FP8 steps (median step time).
        peak_memory_bytes: Peak training memory.
        memory_source: "measured" (torch.cuda.max_memory_allocated) or "predicted" (memory model).
        predicted_memory: The memory model's breakdown (always present).
        wall_s: Wall time of the whole probe, build included.
        device: Where it ran.
        phase_s: Seconds spent per phase: build (model, conversion, optimizer), bf16_steps or
            warmup_steps and fp8_steps (the training loop), eval.
    """

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    fp8_steps: list[bool] = field(default_factory=list)
    eval_loss: float = float("nan")
    diverged: bool = False
    diverged_step: int | None = None
    reason: str = ""
    tokens_per_s: float = 0.0
    peak_memory_bytes: int = 0
    memory_source: str = "predicted"
    predicted_memory: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    device: str = "cpu"
    phase_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ProbeResult":
        return cls(**data)
