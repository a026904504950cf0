"""Correcting the memory model with GPU measurements, so that it extrapolates to the target.

:mod:`precsearch.probe.memory.peak` counts the tensors a training step keeps. What it
does not count (CUDA and cuBLAS workspaces, a library's buffers, allocator
rounding, tensors of an op it mis-models) shows up as the *residual*
``measured - predicted`` of a probe that ran on a GPU. The residual is fitted as

    residual(n_layers) = fixed_bytes + per_layer_bytes * n_layers

and added to the model's prediction for the target, which has the probe's
width, sequence length, micro-batch and policy but more blocks. Fitting the
residual rather than scaling the model's components keeps a correct model
correct: a model that already matches gets a correction near zero at every
depth, and a per-block error (a tensor missed in every block) is what the
per-layer term extrapolates.

From one depth (the probe as a study runs it) only a fixed offset can be
fitted; two or more depths (e.g. 2 and 4 blocks, as ``benchmarks/bench_memory.py``
runs) separate per-block from fixed costs by least squares. Predictions
corrected this way are labelled ``calibrated``; uncorrected ones stay
``predicted``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Precision
from precsearch.probe.memory.peak import MemoryBreakdown, predict_peak
from precsearch.arch.config import ModelConfig


@dataclass(frozen=True)
class DepthMeasurement:
    """One probe's peak memory, as measured and as the model predicted it.

    Attributes:
        n_layers: Transformer blocks the probe had.
        predicted_bytes: :func:`~precsearch.probe.memory.peak.predict_peak`'s total for it.
        measured_bytes: ``torch.cuda.max_memory_allocated`` over its steps.
    """

    n_layers: int
    predicted_bytes: int
    measured_bytes: int

    @property
    def residual(self) -> int:
        return self.measured_bytes - self.predicted_bytes


@dataclass(frozen=True)
class Calibration:
    """A fitted correction: bytes the model misses, ``fixed_bytes + per_layer_bytes * n_layers``.

    Attributes:
        fixed_bytes: Missed bytes that do not grow with depth.
        per_layer_bytes: Missed bytes per transformer block.
        n_points: Measurements it was fitted on (0: no correction, the model as is).
        depths: The distinct block counts measured.
    """

    fixed_bytes: float = 0.0
    per_layer_bytes: float = 0.0
    n_points: int = 0
    depths: tuple[int, ...] = ()

    @property
    def source(self) -> str:
        """``calibrated`` when fitted on a measurement, else ``predicted``."""
        return "calibrated" if self.n_points else "predicted"

    def correct(self, predicted_bytes: int, n_layers: int) -> int:
        """``predicted_bytes`` for a model of ``n_layers`` blocks, plus the bytes the model misses."""
        return int(round(predicted_bytes + self.fixed_bytes + self.per_layer_bytes * n_layers))

    def to_dict(self) -> dict:
        return asdict(self) | {"depths": list(self.depths), "source": self.source}


def fit_calibration(points: Sequence[DepthMeasurement]) -> Calibration:
    """Fit the residual of ``points``: a fixed offset from one depth, fixed + per-block from several.

    Raises:
        ValueError: No measurement, or one with no blocks or no measured bytes.
    """
    if not points:
        raise ValueError("calibration needs at least one measured probe")
    for p in points:
        if p.n_layers < 1 or p.measured_bytes <= 0:
            raise ValueError(f"a calibration point needs n_layers >= 1 and measured_bytes > 0, got {p}")
    depths = tuple(sorted({p.n_layers for p in points}))
    residuals = [p.residual for p in points]
    mean_r = sum(residuals) / len(points)
    if len(depths) == 1:
        return Calibration(fixed_bytes=mean_r, n_points=len(points), depths=depths)
    layers = [p.n_layers for p in points]
    mean_l = sum(layers) / len(points)
    slope = (sum((x - mean_l) * (r - mean_r) for x, r in zip(layers, residuals))
             / sum((x - mean_l) ** 2 for x in layers))
    return Calibration(fixed_bytes=mean_r - slope * mean_l, per_layer_bytes=slope, n_points=len(points),
                       depths=depths)


@dataclass(frozen=True)
class TargetPrediction:
    """Peak memory predicted for the target model.

    Attributes:
        bytes: The corrected peak (``breakdown.total`` when uncalibrated).
        source: ``calibrated`` or ``predicted``.
        breakdown: The uncorrected model's components for the target.
        calibration: The correction applied.
    """

    bytes: int
    source: str
    breakdown: MemoryBreakdown
    calibration: Calibration


def predict_target(target: ModelConfig, precisions: dict[str, Precision], calibration: Calibration, *,
                   seq_len: int, micro_batch: int, param_dtype: str,
                   memory: MemoryKnobs | None = None, grad_accum: int = 1, fp8_linear: str = "te",
                   compiled_blocks: bool = False) -> TargetPrediction:
    """The target's peak under a policy (``precisions`` named for the target's blocks), corrected."""
    breakdown = predict_peak(target, precisions, seq_len=seq_len, micro_batch=micro_batch,
                             param_dtype=param_dtype, memory=memory, grad_accum=grad_accum, fp8_linear=fp8_linear,
                             compiled_blocks=compiled_blocks)
    return TargetPrediction(bytes=calibration.correct(breakdown.total, target.n_layers),
                            source=calibration.source, breakdown=breakdown, calibration=calibration)
