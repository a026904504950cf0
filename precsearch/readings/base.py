"""The stability reading: what a trial's instability is read from, behind one small base class.

A study's ``objectives.reading`` names one :class:`StabilityReading` of the registry
(:mod:`precsearch.readings.registry`); every consumer asks the object and none names a reading. This
module is in the base layer: it imports nothing of the package, and reads what it is handed by its
attributes (a probe result's ``eval_loss``, ``losses``, ``damage``; the objectives section's fields) or,
for a stored study, as plain dicts.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

#: Instability given to a diverged probe (or a reading that failed): far outside any sensible stability limit.
DIVERGED_INSTABILITY = 1.0


def finite(x: Any) -> bool:
    """Whether ``x`` is a finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def noise_text(floor: float, gap_in_noise: float) -> str:
    """The noise floor and a gap in its units, as shown next to a verdict: ``0.80% (+3.88x)`` (two decimals: one
    printed a gap of 1.98 floors as +2.0x, the limit of a noise study)."""
    if not math.isfinite(floor):
        return "unknown (one seed)"
    return f"{100 * floor:.2f}% ({gap_in_noise:+.2f}x)" if math.isfinite(gap_in_noise) else f"{100 * floor:.2f}%"


@dataclass(frozen=True)
class Judged:
    """A probe read against its BF16 reference by a reading (one learning rate).

    Attributes:
        instability: The objective (relative, or the reading's own measure).
        constraint: Optuna's constraint: <= 0 exactly when stable.
        read_gap: The signed gap the instability was read from (NaN where none).
        value: The reading's own figure where it has one (NaN otherwise), and ``se`` its standard error.
    """

    instability: float
    constraint: float
    read_gap: float
    value: float = math.nan
    se: float = math.nan


class StabilityReading(ABC):
    """One way of reading a trial's stability against its BF16 reference.

    The contract every reading keeps (``tests/readings/test_contract.py`` checks it for each one registered):

    * :attr:`name` is the value of ``objectives.reading`` that picks it, and :attr:`description` says what it
      reads, for the space file's field;
    * :meth:`noise_losses` gives, per BF16 seed reference, the loss whose relative spread is the study's noise
      floor; :meth:`judge` turns a probe's figures into instability, constraint and the gap read, using no
      figure of a diverged probe (the caller scores those :data:`DIVERGED_INSTABILITY`), and a figure it cannot
      read makes the trial unstable, never stable;
    * a reading with :attr:`own_unit` reads instability in its own measure (not in ``stability_unit`` against
      the seeds' floor): :meth:`unit_kind` is then its name, :meth:`limit` its own limit, and :meth:`unit_name`,
      :meth:`standard_error` say what that measure is and how sure; a reading without gives ``stability_unit``
      and ``stability_limit``; it also names its legacy display metric (:attr:`legacy_column`) and what the
      front's plot calls it (:attr:`plot_subject`);
    * a reading with :attr:`fixed_states` reads each trial's probe at fixed states of a BF16 run: the probe
      process makes that BF16 side once per gradient-clipping value, and it reads one-process probes only;
      :meth:`side_runs` gives a worker's loop the object that keeps which sides its probe process made, the
      steps of those still to make (for the time left) and the seconds a trial's probe spent on one; a reading
      without sides gives :class:`SideRuns`, which has none; :meth:`standard_reference` says whether the study
      also reads the standard FP8 recipe there, once per clipping value, to show each reading as a multiple of it;
    * :meth:`metrics` names the extra MLflow metrics it records, and :meth:`verdict_figures` the words after
      the verdict (``; gap +2.47% vs BF16 seed noise ...``); :meth:`infeasible_reason` says why a trial over
      its limit is not feasible, for ``precsearch export``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    #: Instability is the reading's own measure, not a loss gap in ``stability_unit``.
    own_unit: ClassVar[bool] = False
    #: The probe process makes a BF16 side (the BF16 run's states) and reads each trial's probe there.
    fixed_states: ClassVar[bool] = False
    #: With :attr:`own_unit`: the per-unit display metric earlier versions logged (still logged).
    legacy_column: ClassVar[str] = ""
    #: With :attr:`own_unit`: what the front's plot calls the instability axis (``memory saved vs ...``).
    plot_subject: ClassVar[str] = ""

    def noise_losses(self, references: Sequence[Any], tail_fraction: float) -> list[float]:
        """Per BF16 seed reference (a probe result), the loss whose seed spread is the noise floor: the held-out
        loss unless the reading reads another."""
        return [r.eval_loss for r in references]

    def noise_floor(self, references: Sequence[Any], tail_fraction: float) -> float:
        """The seeds' spread of :meth:`noise_losses`, relative to their mean; NaN with fewer than 2."""
        losses = self.noise_losses(references, tail_fraction)
        if len(losses) < 2 or not all(math.isfinite(x) for x in losses):
            return math.nan
        return statistics.stdev(losses) / statistics.fmean(losses)

    @abstractmethod
    def judge(self, result: Any, objectives: Any, *, gap: float, tail: float, excess: int, floor: float) -> Judged:
        """Read a probe that did not diverge.

        Args:
            result: The policy's probe result.
            objectives: The space's objectives section.
            gap: The held-out loss gap against the paired BF16 reference.
            tail: The paired training-loss gap over the tail window.
            excess: Loss spikes and gradient blow-ups beyond the reference's.
            floor: The BF16 seeds' noise floor (NaN when unknown).
        """

    def unit_kind(self, stability_unit: str) -> str:
        """What instability is measured in: this reading's name where it has its own unit, else ``stability_unit``."""
        return self.name if self.own_unit else stability_unit

    def from_checkpoint(self, objectives: Any) -> Any:
        """The ``objectives`` section (a validated config section) for a probe that starts from a checkpoint
        (``model.init_from``): as it is, unless the reading reads states of a run of its own and the checkpoint
        is one of them."""
        return objectives

    def limit(self, objectives: Mapping[str, Any]) -> float:
        """The stability limit in :meth:`unit_kind`, from ``objectives`` as a dict (NaN when it has none)."""
        limit = objectives.get("stability_limit")
        return float(limit) if finite(limit) else math.nan

    def measure(self, objectives: Mapping[str, Any]) -> str:
        """The figure read in the reading's own unit (from ``objectives`` as a dict); "" without one."""
        return ""

    def row_measure(self, row: Mapping[str, Any]) -> str:
        """The figure a stored score or front row was read in (its own unit's measure); "" without one."""
        return ""

    def unit_name(self, measure: str) -> str:
        """The reading's own unit in words, for its ``measure``; only for a reading with :attr:`own_unit`."""
        raise NotImplementedError(f"reading {self.name!r} has no unit of its own")

    def standard_error(self, score: Mapping[str, Any]) -> float:
        """The standard error of a stored score's instability; NaN where the reading has none."""
        return math.nan

    def metrics(self, score: Any) -> dict[str, float]:
        """The reading's own MLflow metrics of a :class:`~precsearch.search.scoring.Score` (none by default)."""
        return {}

    def verdict_figures(self, score: Any) -> str:
        """What follows the verdict word for a probe that did not diverge: the gap read against the noise floor."""
        return f"; gap {100 * score.instability_gap:+.2f}% vs BF16 seed noise " \
               f"{noise_text(score.noise_floor, score.gap_in_noise)}"

    def infeasible_reason(self, shown: str) -> str:
        """Why a trial whose instability reads ``shown`` is not stable, after ``trial N is not feasible: ``."""
        return (f"instability {shown} (objectives.stability_limit); it trained measurably worse than BF16 in its "
                f"probe")

    def side_runs(self, clip_values: Sequence[Any], steps: int) -> "SideRuns":
        """The BF16 sides one worker's probe process makes for this reading, over a study whose gradient clipping
        takes ``clip_values`` and whose probe runs ``steps`` steps (none by default)."""
        return SideRuns()

    def standard_reference(self, objectives: Any) -> bool:
        """Whether a study with ``objectives`` (the validated section) reads the standard FP8 recipe beside its trials
        (:data:`precsearch.recipes.STANDARD_FP8`), to show each trial's reading as a multiple of it (none by
        default: only a reading of fixed states reads a policy apart from its probe)."""
        return False

    def passes_per_state(self, objectives: Any) -> tuple[int, str] | None:
        """How many passes the reading quantizes at one state, from fresh FP8 scalers, where it reads fixed
        states (so a delayed-scaling amax history of that many entries or more holds all it sees), and the
        fields that set it; None for a reading of the probe's own run, whose scalers keep their history."""
        return None

    def legacy_value(self, instability: float) -> float:
        """The per-unit display metric of earlier versions for a reading with its own unit (3 significant digits)."""
        return float(f"{instability:.3g}")


class SideRuns:
    """The BF16 runs a reading makes beside one worker's trials (its sides), what is left of them and what they
    cost; made by :meth:`StabilityReading.side_runs`, one per worker, and asked by the study loop, which does
    not know the reading. This one has none (a reading that reads the probe alone)."""

    def steps_ahead(self) -> int:
        """Steps of the sides still to make (an estimate: a clipping value the sampler never picks makes none)."""
        return 0

    def begin(self, clip_grad: Any, trial: int) -> str | None:
        """Trial ``trial``'s probe, at ``clip_grad``, is about to run: the line that says it makes a side first
        (the first time for ``clip_grad`` in this probe process), else None."""
        return None

    def seconds_in(self, result: Any) -> float:
        """Seconds of a trial's probe ``result`` that its reading spent making a side (0 when it made none):
        timed apart, a per-trial rate holding them would multiply them by every trial left."""
        return 0.0


class LossGapReading(StabilityReading):
    """A reading of a signed loss gap: instability = max(gap, 0) + spike penalty x excess events, read in
    ``stability_unit`` (relative, or in multiples of the noise floor)."""

    @abstractmethod
    def read_gap(self, gap: float, tail: float) -> float:
        """Which of the held-out gap and the tail gap is read."""

    def judge(self, result: Any, objectives: Any, *, gap: float, tail: float, excess: int, floor: float) -> Judged:
        read = self.read_gap(gap, tail)
        # a lead over BF16 counts as 0: a policy cannot score "more stable than BF16" by falling faster early
        instability = max(read, 0.0) + objectives.spike_penalty * excess
        measured = instability if objectives.stability_unit == "relative" else \
            (instability / floor if floor > 0 else math.nan)
        # An unknown floor cannot pass a limit set in noise units (the space check rules out one seed).
        constraint = measured - objectives.stability_limit if math.isfinite(measured) else DIVERGED_INSTABILITY
        return Judged(instability, constraint, read)
