"""A trial's result, scored once: the one record the terminal, Optuna, the front and MLflow read.

:func:`score_trial` scores a probe against its BF16 references (:func:`precsearch.search.scoring.score`) and
reads everything the outputs show from that score: the values Optuna is told, the verdict line, the stability
metrics, the instability in the study's unit. The record is stored as the trial's user attribute ``score``
(the score's fields, the layout of every earlier version); the recorder, which writes the MLflow run after
the tell, rebuilds it from there (:meth:`ScoredTrial.from_stored`) rather than scoring the probe again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from precsearch.config.space import ObjectivesSection
from precsearch.instability import Reading
from precsearch.probe.framework_step import FrameworkSpeed
from precsearch.probe.result import ProbeResult
from precsearch.search.scoring import (
    Score,
    instability_reading,
    objective_values,
    score,
    stability_metrics,
    verdict_line,
)


@dataclass(frozen=True)
class ScoredTrial:
    """A trial's score and what every output reads from it.

    Attributes:
        score: The score (objectives, stability figures, verdict's inputs).
        values: Optuna's objective values, in :func:`~precsearch.search.scoring.objective_names` order.
        verdict: The verdict line the terminal prints and MLflow tags (``instability 1.98 ... [feasible; ...]``).
        stability: The stability metrics MLflow logs (:func:`~precsearch.search.scoring.stability_metrics`).
        instability: The instability in the study's one unit (:mod:`precsearch.instability`).
    """

    score: Score
    values: tuple[float, ...]
    verdict: str
    stability: Mapping[str, float]
    instability: Reading

    @classmethod
    def of(cls, s: Score, objectives: ObjectivesSection) -> "ScoredTrial":
        """The record of the score ``s`` of a study with ``objectives``."""
        return cls(s, tuple(objective_values(s, objectives)), verdict_line(s, objectives), stability_metrics(s),
                   instability_reading(s, objectives))

    @classmethod
    def from_stored(cls, data: Mapping[str, Any], objectives: ObjectivesSection) -> "ScoredTrial":
        """The record of a told trial, from its user attribute ``score`` (:meth:`to_dict`); nothing is scored."""
        return cls.of(Score.from_dict(data), objectives)

    @property
    def constraint(self) -> float:
        """Optuna's constraint: <= 0 exactly when feasible."""
        return self.score.constraint

    def to_dict(self) -> dict[str, Any]:
        """What the trial stores as its user attribute ``score``."""
        return self.score.to_dict()


def score_trial(result: ProbeResult, paired: ProbeResult, objectives: ObjectivesSection, *,
                noise_floor: float = math.nan, stress: tuple[ProbeResult, ProbeResult] | None = None,
                standard: Mapping[str, Any] | None = None, framework: tuple[str, float] | None = None,
                framework_speed: FrameworkSpeed | None = None) -> ScoredTrial:
    """Score ``result`` against its paired BF16 reference, beside the standard FP8 recipe's reading where there
    is one, with the memory the study's framework target saves and its speed-up where it has one (see
    :func:`~precsearch.search.scoring.score`)."""
    return ScoredTrial.of(score(result, paired, objectives, noise_floor=noise_floor, stress=stress,
                                standard=standard, framework=framework, framework_speed=framework_speed),
                        objectives)
