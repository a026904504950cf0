"""``study.fidelity``: the probe lengths (rungs) a study promotes its best policies through.

Every policy gets the first rung (``probe.steps`` steps); after the whole first
rung has finished, the best feasible policies (see
:mod:`precsearch.search.promotion`) continue to the next rung, and so on. A
rung *continues* the previous rung's run from its saved state, and the
learning-rate schedule of every probe in such a study is laid out over the
longest rung, so each rung is a prefix of one and the same run.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from precsearch.config.section import Section
from precsearch.utils.numbers import MAX_COUNT


class FidelitySection(Section):
    """Rungs of probe length and how many policies each promotion keeps.

    Attributes:
        rungs: Probe lengths in steps, strictly increasing; the first must equal
            ``probe.steps`` (checked with the whole space, in :mod:`precsearch.config.checks`).
        promote: At most this many policies go from one rung to the next.
    """

    rungs: list[int] = Field(min_length=1, description="probe lengths in steps; the first equals probe.steps")
    promote: int = Field(4, ge=1, le=MAX_COUNT,
        description="at most this many policies continue from one rung to the next")

    @field_validator("rungs")
    @classmethod
    def _increasing(cls, rungs: list[int]) -> list[int]:
        if any(r <= 0 or r > MAX_COUNT for r in rungs):
            raise ValueError(f"rungs are step counts and must be > 0 and at most {MAX_COUNT}; got {rungs}")
        if any(b <= a for a, b in zip(rungs, rungs[1:])):
            raise ValueError(f"rungs must be strictly increasing (each a longer probe); got {rungs}")
        return rungs

    @property
    def horizon(self) -> int:
        """The longest rung: every probe's learning-rate schedule is laid out over it."""
        return self.rungs[-1]

    def next_rung(self, steps: int) -> int | None:
        """The rung after the one of ``steps`` steps, or None for the last rung."""
        later = [r for r in self.rungs if r > steps]
        return later[0] if later else None

    def previous_rung(self, steps: int) -> int | None:
        """The rung before the one of ``steps`` steps, or None for the first."""
        earlier = [r for r in self.rungs if r < steps]
        return earlier[-1] if earlier else None
