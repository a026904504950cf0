"""A study's instability in its one unit: the value, the unit's name, the limit, the interval and a band.

A study states its stability limit in one unit, and every output shows instability in that unit, as
this module words and rounds it: the terminal's trial line, ``precsearch front`` and ``front/``, the
MLflow metric ``instability_in_unit`` with the tag ``instability_unit``, the exported ``policy.yaml``
and ``precsearch export --max-instability``. The unit:

* ``stability_unit: relative`` (the default): a fraction of the BF16 loss (``0.01`` is 1%);
* ``stability_unit: noise``: BF16 seed spreads, the instability over the reference's noise floor;
* a reading with its own unit (:mod:`precsearch.readings`; the fixed-state reading's
  ``objectives.damage.measure``, ``update_norm``...): that measure, whose standard error gives an interval,
  value ± :data:`INTERVAL_SE` SE.

The **band** says where a reading stands against the limit, taking what the reading cannot resolve
into account. Its upper end is value + 2 SE (the value where there is no standard error), its lower
end value - 2 SE (the value):

* ``stable``: the upper end at most ``(1 - MARGIN) x limit``: clear of the limit by a tenth of it, the
  margin ``precsearch export --pick`` keeps by default (a trial at 1.98 of a 2.0 limit passed by a hair
  in one seeded probe, and another seed may fail it);
* ``near the limit``: neither: within the margin, or its interval overlaps the limit;
* ``unstable``: the lower end above the limit;
* ``unknown``: no finite value (a noise study without a noise floor, a reading that failed).

The band is about the reading alone: a trial's verdict (feasible, unstable, diverged) also counts
loss spikes, divergence and stress. This module is in the base layer (it imports only the readings, also
there) so that tracking and export can word instability as the search does; it reads the stored
score and objectives as plain dicts, as a stored study holds them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from precsearch.readings.damage import MEASURES
from precsearch.readings.registry import own_unit_reading, reading_of
from precsearch.recipes import STANDARD_FP8_NAME

#: Standard errors each side of a reading that has one, as the front's interval-aware Pareto reads it.
INTERVAL_SE = 2.0
#: The share of the limit a ``stable`` reading keeps clear of (export's default ``--margin``).
MARGIN = 0.1
#: The bands, safest first (the front ranks trials by it before their readings).
BANDS = ("stable", "near the limit", "unstable", "unknown")

RELATIVE_NAME = "fraction of the BF16 loss"
NOISE_NAME = "BF16 seed spreads"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def number(value: float, limit: float = math.nan, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, more where fewer would print a value on the other side of
    ``limit`` (or on it) as the limit: 1.982 of a 2.0 limit is ``1.98``, 1.9996 is ``1.9996``, never ``2``."""
    if not _finite(value):
        return "-"
    for d in range(digits, 17):
        text = f"{value:.{d}g}"
        shown = float(text)
        if not _finite(limit) or value == limit or (shown < limit) == (value < limit) and shown != limit:
            return text
    return repr(value)


@dataclass(frozen=True)
class StudyUnit:
    """The unit a study's instability and limit are in.

    Attributes:
        kind: ``relative``, ``noise``, or the name of a reading with its own unit
            (:meth:`precsearch.readings.StabilityReading.unit_kind`).
        limit: The stability limit, in this unit.
        measure: That reading's figure (``update_norm``...); empty for the other kinds.
    """

    kind: str
    limit: float
    measure: str = ""

    @classmethod
    def of(cls, objectives: Mapping[str, Any]) -> "StudyUnit":
        """The unit of a study's ``objectives`` section, as a dict (a stored study's space, of any version)."""
        reading = reading_of(objectives)
        kind = reading.unit_kind(objectives.get("stability_unit") or "relative")
        return cls(kind, reading.limit(objectives), reading.measure(objectives))

    @classmethod
    def for_row(cls, kind: str, limit: float, row: Mapping[str, Any]) -> "StudyUnit":
        """The unit ``kind`` with ``limit``, its measure read from a front row or stored score where the unit is a
        reading's own (:meth:`precsearch.readings.StabilityReading.row_measure`)."""
        own = own_unit_reading(kind)
        return cls(kind, limit, own.row_measure(row) if own is not None else "")

    @property
    def name(self) -> str:
        """The unit in words: ``BF16 seed spreads``, ``fraction of the BF16 loss``,
        ``update_norm (AdamW update error bias^2 / update^2)``."""
        own = own_unit_reading(self.kind)
        if own is not None:
            return own.unit_name(self.measure)
        return NOISE_NAME if self.kind == "noise" else RELATIVE_NAME

    @property
    def limit_text(self) -> str:
        return number(self.limit)

    def value(self, score: Mapping[str, Any]) -> float:
        """A stored score's instability in this unit (NaN for a noise study with no noise floor): the score keeps
        instability relative (it is an Optuna objective, and the floor differs between references)."""
        instability = score.get("instability")
        if not _finite(instability):
            return math.nan
        if self.kind != "noise":
            return float(instability)
        floor = score.get("noise_floor")
        return instability / floor if _finite(floor) and floor > 0 else math.nan

    def read(self, score: Mapping[str, Any]) -> "Reading":
        """The reading of a stored score or front row (``instability``, ``noise_floor``; ``damage_se`` or
        ``instability_se``; the standard FP8 recipe's ``instability_standard``, ``standard_recipe`` and
        ``instability_vs_standard`` where it has them)."""
        own = own_unit_reading(self.kind)
        standard = score.get("instability_standard", math.nan)
        ratio = score.get("instability_vs_standard", math.nan)
        return Reading(self.value(score), own.standard_error(score) if own is not None else math.nan, self,
                       float(standard) if _finite(standard) else math.nan, str(score.get("standard_recipe") or ""),
                       float(ratio) if _finite(ratio) else math.nan)


@dataclass(frozen=True)
class Reading:
    """One trial's instability in its study's unit, with its standard error (NaN where the reading has none).

    Where the study read the standard FP8 recipe at the same states (``objectives.damage.standard_reference``),
    ``standard`` is its reading in the same unit, ``standard_recipe`` what it ran, and ``vs_standard`` this reading
    as a multiple of it; NaN (and "") otherwise, and every output then says nothing of it.
    """

    value: float
    se: float
    unit: StudyUnit
    standard: float = math.nan
    standard_recipe: str = ""
    vs_standard: float = math.nan

    @property
    def interval(self) -> tuple[float, float] | None:
        """(value - 2 SE, value + 2 SE), or None where the reading has no standard error."""
        if not (_finite(self.se) and _finite(self.value)):
            return None
        return self.value - INTERVAL_SE * self.se, self.value + INTERVAL_SE * self.se

    def clear_of(self, limit: float, share: float = MARGIN) -> bool:
        """Whether the interval's upper end (the value where there is none) is at most ``(1 - share) x limit``:
        the ``stable`` band's rule, and the margin ``precsearch export --pick`` keeps."""
        return (self.interval or (self.value, self.value))[1] <= (1 - share) * limit

    @property
    def band(self) -> str:
        """``stable``, ``near the limit``, ``unstable`` or ``unknown`` (see the module docstring)."""
        if not _finite(self.value) or not _finite(self.unit.limit):
            return "unknown"
        if self.clear_of(self.unit.limit):
            return "stable"
        low = (self.interval or (self.value, self.value))[0]
        return "unstable" if low > self.unit.limit else "near the limit"

    @property
    def number(self) -> str:
        """The value as every output prints it (:func:`number` against the limit)."""
        return number(self.value, self.unit.limit)

    @property
    def figure(self) -> str:
        """The value with its interval's half-width: ``1.98`` or ``0.00138 ± 0.00062 (2 SE)``."""
        spread = f" ± {number(INTERVAL_SE * self.se, digits=2)} (2 SE)" if self.interval else ""
        return self.number + spread

    @property
    def multiple(self) -> str:
        """:attr:`vs_standard` as every output prints it, two significant digits below 10: ``1.3x``, ``0.21x``,
        ``58x``, ``5833x``; ``-`` without one."""
        if not (_finite(self.vs_standard) and _finite(self.standard)):
            return "-"
        return f"{self.vs_standard:.0f}x" if self.vs_standard >= 9.95 else f"{number(self.vs_standard, digits=2)}x"

    @property
    def beside_standard(self) -> str:
        """`` = 1.3x the standard FP8 recipe's 0.0012 (FP8 delayed scaling on every block Linear, ...)``, what a
        reader takes the figure's size from; "" where the study read no standard recipe."""
        if self.multiple == "-":
            return ""
        what = f" ({self.standard_recipe})" if self.standard_recipe else ""
        return f" = {self.multiple} {STANDARD_FP8_NAME}'s {number(self.standard, self.unit.limit)}{what}"

    def text(self) -> str:
        """The reading in words: ``1.98 BF16 seed spreads; limit 2: near the limit``; with the standard FP8 recipe's
        reading where the study has one, ``0.00157 ± 0.0008 (2 SE) update_norm (...) = 1.3x the standard FP8
        recipe's 0.0012 (...); limit 0.002: near the limit``."""
        limit = f"; limit {self.unit.limit_text}" if _finite(self.unit.limit) else ""
        if not _finite(self.value):
            return f"unknown in {self.unit.name}{limit}"
        shown = f"{self.figure} {self.unit.name}{self.beside_standard}"
        return f"{shown}{limit}: {self.band}" if limit else shown


__all__ = ["BANDS", "INTERVAL_SE", "MARGIN", "MEASURES", "Reading", "StudyUnit", "number"]
