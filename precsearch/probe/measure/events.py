"""Per-step training events: loss spikes, gradient-norm blow-ups, non-finite values.

A probe's final loss says how training ended; these events say how it got
there. Each step's loss and gradient norm are compared with what came before:

* **loss spike**: the loss is more than ``spike_threshold`` (relative) above an
  exponential running mean of earlier losses;
* **gradient blow-up**: the gradient norm (before clipping) is more than
  ``blowup_factor`` times the median of the last ``window`` gradient norms;
* **non-finite**: the loss or the gradient norm is NaN or Inf.

The first ``warmup`` steps only feed the baselines: at initialisation the
loss and gradient norm fall fast and every step would look like an outlier.
Spikes and blow-ups still enter the baselines afterwards (a spike raises the
running mean a little), so a lasting level shift is reported once, not at
every step after it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Literal

EventKind = Literal["loss_spike", "grad_blowup", "non_finite"]


@dataclass(frozen=True)
class StepEvent:
    """One unusual step.

    Attributes:
        step: The training step (0-based).
        kind: ``loss_spike``, ``grad_blowup`` or ``non_finite``.
        value: The loss (spike) or gradient norm (blow-up) at that step; for
            ``non_finite``, whichever of the two was not finite.
        baseline: What it was compared with: the running mean loss, the median
            recent gradient norm, or NaN for ``non_finite``.
    """

    step: int
    kind: EventKind
    value: float
    baseline: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepMonitor:
    """Detects :class:`StepEvent` s one step at a time, as the probe trains.

    Args:
        spike_threshold: Relative jump above the running mean loss that is a spike.
        blowup_factor: Multiple of the median recent gradient norm that is a blow-up.
        warmup: Steps that only feed the baselines.
        alpha: Weight of the newest loss in the running mean.
        window: How many recent gradient norms the median is taken over.
    """

    def __init__(self, spike_threshold: float, blowup_factor: float, *, warmup: int = 3,
                 alpha: float = 0.1, window: int = 20):
        self.spike_threshold = spike_threshold
        self.blowup_factor = blowup_factor
        self.warmup = warmup
        self.alpha = alpha
        self._mean_loss: float | None = None
        self._grad_norms: deque[float] = deque(maxlen=window)

    def observe(self, step: int, loss: float, grad_norm: float) -> list[StepEvent]:
        """The events at ``step`` (often none); then fold the step into the baselines."""
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            value = loss if not math.isfinite(loss) else grad_norm
            return [StepEvent(step, "non_finite", value, math.nan)]
        events = []
        if step >= self.warmup and self._mean_loss is not None \
                and loss > self._mean_loss * (1 + self.spike_threshold):
            events.append(StepEvent(step, "loss_spike", loss, self._mean_loss))
        if step >= self.warmup and self._grad_norms:
            median = statistics.median(self._grad_norms)
            if grad_norm > self.blowup_factor * median:
                events.append(StepEvent(step, "grad_blowup", grad_norm, median))
        self._mean_loss = loss if self._mean_loss is None else (1 - self.alpha) * self._mean_loss + self.alpha * loss
        self._grad_norms.append(grad_norm)
        return events

    def state_dict(self) -> dict[str, Any]:
        """The baselines so far, to continue a run from a checkpoint (:mod:`precsearch.probe.continuation`)."""
        return {"mean_loss": self._mean_loss, "grad_norms": list(self._grad_norms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take up the baselines :meth:`state_dict` returned."""
        self._mean_loss = state["mean_loss"]
        self._grad_norms.clear()
        self._grad_norms.extend(state["grad_norms"])


def count_events(events: list[dict[str, Any]], kind: EventKind) -> int:
    """How many of a probe's recorded events (dicts, as in :class:`ProbeResult`) are of ``kind``."""
    return sum(1 for e in events if e["kind"] == kind)
