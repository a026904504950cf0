"""``tail``: the paired training-loss gap over the run's last ``objectives.tail_fraction`` of steps.

Both runs see the same batch at every step, so the ratio is paired (batch difficulty cancels), and a
window is less noisy than one point. The noise floor is then the seeds' spread of their tail-mean loss.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, ClassVar

from precsearch.readings.base import LossGapReading

#: A reference still falling more than this across the tail window is read as still in its early descent.
TRANSIENT_DESCENT = 0.01


def tail_window(steps: int, fraction: float) -> int:
    """Steps in the tail window of a ``steps``-step run: ``ceil(fraction x steps)``, at least 1."""
    return max(1, math.ceil(fraction * steps))


def tail_mean(losses: Sequence[float], fraction: float, steps: int | None = None) -> float:
    """Mean of the losses in the tail window of the first ``steps`` (default: all) of ``losses``."""
    steps = len(losses) if steps is None else steps
    if steps == 0:
        return math.nan
    return statistics.fmean(losses[steps - tail_window(steps, fraction):steps])


class TailReading(LossGapReading):
    """Reads the paired tail gap; says so when the BF16 reference is still in its early descent."""

    name: ClassVar[str] = "tail"
    description: ClassVar[str] = "paired training loss over the run's last part"

    def noise_losses(self, references: Sequence[Any], tail_fraction: float) -> list[float]:
        return [tail_mean(r.losses, tail_fraction) for r in references]

    def read_gap(self, gap: float, tail: float) -> float:
        return tail

    def verdict_figures(self, score: Any) -> str:
        words = super().verdict_figures(score)
        if score.reference_tail_descent > TRANSIENT_DESCENT:
            words += f"; BF16 still falling {100 * score.reference_tail_descent:.1f}% over the tail (early descent)"
        return words
