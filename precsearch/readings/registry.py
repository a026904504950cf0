"""The stability readings by name: the one list the space file's ``objectives.reading``, scoring, the
probe host, the reports and the export read.

A new reading is a module here with a :class:`~precsearch.readings.base.StabilityReading` and a row in
:data:`READINGS`; ``tests/readings/test_contract.py`` then runs the contract over it, and
``tests/readings/test_no_reading_names.py`` fails on a module outside ``precsearch/readings/`` that names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from precsearch.readings.base import StabilityReading
from precsearch.readings.damage import DamageReading
from precsearch.readings.final import FinalReading
from precsearch.readings.tail import TailReading

READINGS: dict[str, StabilityReading] = {r.name: r for r in (FinalReading(), TailReading(), DamageReading())}
"""Reading name -> reading, the default first."""

READING_NAMES: tuple[str, ...] = tuple(READINGS)
#: The reading a space without ``objectives.reading`` (and a score stored without one) has.
DEFAULT_READING: str = READING_NAMES[0]


def get_reading(name: str | None) -> StabilityReading:
    """The reading named ``name`` (None or "" for the default); ValueError naming the valid ones otherwise."""
    try:
        return READINGS[name or DEFAULT_READING]
    except KeyError:
        raise ValueError(f"unknown stability reading {name!r}; valid: {', '.join(READING_NAMES)}") from None


def reading_of(objectives: Mapping[str, Any]) -> StabilityReading:
    """The reading of a study's ``objectives`` section as a dict (a stored study's space, of any version)."""
    return get_reading(objectives.get("reading"))


def own_unit_reading(unit: str) -> StabilityReading | None:
    """The reading whose own unit a study's instability unit ``unit`` is (:meth:`StabilityReading.unit_kind`),
    or None for a loss-gap unit (``relative``, ``noise``)."""
    reading = READINGS.get(unit)
    return reading if reading is not None and reading.own_unit else None


def description() -> str:
    """Every reading in a line, for the space file's field: ``final: held-out loss after training; tail: ...``."""
    return "; ".join(f"{r.name}: {r.description}" for r in READINGS.values())
