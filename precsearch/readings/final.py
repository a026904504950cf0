"""``final`` (the default): the held-out loss gap after training."""

from __future__ import annotations

from typing import ClassVar

from precsearch.readings.base import LossGapReading


class FinalReading(LossGapReading):
    """Reads the held-out loss gap (fixed batches from the end of the data, never trained on)."""

    name: ClassVar[str] = "final"
    description: ClassVar[str] = "held-out loss after training"

    def read_gap(self, gap: float, tail: float) -> float:
        return gap
