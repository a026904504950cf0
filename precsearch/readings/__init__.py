"""The stability readings: what a trial's instability is read from (``objectives.reading``).

One module per reading (:mod:`~precsearch.readings.final`, :mod:`~precsearch.readings.tail`,
:mod:`~precsearch.readings.damage`) behind :class:`StabilityReading` (:mod:`~precsearch.readings.base`,
whose docstring is the contract), in one registry (:mod:`~precsearch.readings.registry`). Consumers ask the
reading, never switch on its name. Base layer: no torch, nothing of the package above.
"""

from precsearch.readings.base import (DIVERGED_INSTABILITY, Judged, LossGapReading, SideRuns, StabilityReading,
                                      noise_text)
from precsearch.readings.registry import (DEFAULT_READING, READING_NAMES, READINGS, get_reading, own_unit_reading,
                                          reading_of)

__all__ = ["DEFAULT_READING", "DIVERGED_INSTABILITY", "Judged", "LossGapReading", "READINGS", "READING_NAMES",
           "SideRuns", "StabilityReading", "get_reading", "noise_text", "own_unit_reading", "reading_of"]
