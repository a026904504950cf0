"""Which trial to export: the pick rules (``--pick``), one registry read by the CLI and :func:`choose_trial`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from precsearch.errors import UserError
from precsearch.instability import MARGIN, StudyUnit, number


@dataclass(frozen=True)
class Pick:
    """One rule for choosing a trial.

    Attributes:
        key: Sort key of a trial row; the smallest wins (ties end on the trial number).
        verb: How the reason sentence says why the trial won ("saves the most memory").
    """

    key: Callable[[dict[str, Any]], tuple]
    verb: str


PICKS: dict[str, Pick] = {
    "max-memory": Pick(lambda r: (-r["memory_saved"], r["instability"], r["trial"]), "saves the most memory"),
    "fastest": Pick(lambda r: (-(r.get("tokens_per_s") or 0.0), -r["memory_saved"], r["trial"]), "is the fastest"),
    "most-stable": Pick(lambda r: (r["instability"], -r["memory_saved"], r["trial"]), "is the most stable"),
}
"""Pick name -> rule, in the order ``--pick`` lists them."""


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def instability_in(row: dict[str, Any], unit: str | StudyUnit) -> float:
    """A trial row's instability in its study's one unit (:mod:`precsearch.instability`): the relative loss gap
    (``relative``, a fraction as ``stability_limit`` is), BF16 seed spreads (``noise``: over the reference's noise
    floor), or the fixed-state reading (``damage``, in its measure)."""
    return _study_unit(unit).value(row)


def unit_name(unit: str | StudyUnit) -> str:
    """How a limit in ``unit`` reads after its number: ``<= 1.5 BF16 seed spreads``,
    ``<= 0.005 fraction of the BF16 loss``, ``<= 0.005 update_norm (...)``."""
    return _study_unit(unit).name


def _study_unit(unit: str | StudyUnit, limit: float = math.nan) -> StudyUnit:
    """``unit`` as a :class:`StudyUnit` (a kind alone: a damage unit without its measure)."""
    return unit if isinstance(unit, StudyUnit) else StudyUnit(unit, limit)


#: The share of the stability limit a pick keeps clear of by default (``--margin``): a trial at 1.98 of a
#: 2.0 limit passed by a hair in one seeded probe, and another seed may well fail it.
DEFAULT_MARGIN = MARGIN  # the "stable" band's clearance: a pick keeps what the outputs call stable


@dataclass(frozen=True)
class Margin:
    """The study's stability limit, in the unit instability is compared in, and the share of it a pick keeps clear.

    A trial keeps the margin when its instability in that unit, plus two standard errors where the reading has
    them (the ``damage`` reading's ``instability_se``), is at most ``(1 - share) x limit``. ``share`` 0 keeps none.
    """

    limit: float
    share: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if not (_finite(self.share) and 0 <= self.share < 1):
            raise UserError(f"{self.share}: a share of the stability limit; valid: 0 (keep none) up to below 1, "
                            f"e.g. {DEFAULT_MARGIN}", field="--margin")

    def keeps(self, row: dict[str, Any], unit: str | StudyUnit) -> bool:
        """Whether ``row`` stays clear of the limit (always, with no margin or no finite limit)."""
        if self.share == 0 or not _finite(self.limit):
            return True
        return _study_unit(unit).read(row).clear_of(self.limit, self.share)

    def describe(self, row: dict[str, Any], unit: str | StudyUnit) -> str:
        """``instability 1.98 of limit 2`` (with ``± 2 SE`` where the reading has one), digits as every output
        prints them (:func:`precsearch.instability.number`)."""
        study = _study_unit(unit)
        shown = StudyUnit(study.kind, self.limit, study.measure).read(row)
        return f"instability {shown.figure} of limit {number(self.limit)}"


def choose_trial(rows: list[dict[str, Any]], pick: str, max_instability: float | None = None,
                 unit: str | StudyUnit = "relative", margin: Margin | None = None) -> tuple[dict[str, Any], str]:
    """Pick one trial row by a rule; return it and a sentence saying why.

    Rows are :func:`precsearch.search.front.trial_rows` dicts. Only feasible,
    non-diverged trials are candidates, further limited to an instability of at
    most ``max_instability`` in ``unit`` (the study's ``stability_unit``, the unit
    of its ``stability_limit``: a study in seed spreads is limited in seed spreads)
    when that is given.

    * ``max-memory``: the most memory saved; ties go to the lower instability.
    * ``fastest``: the highest tokens/s among the Pareto front; ties go to more memory saved.
    * ``most-stable``: the lowest instability; ties go to more memory saved.

    Remaining ties go to the lower trial number, so the choice is deterministic. With a
    ``margin``, candidates that keep it (:meth:`Margin.keeps`) come first: the rule's winner
    among all candidates is taken only when none keeps it, and the sentence names a winner
    passed over for sitting near the limit.

    Raises:
        UserError: Unknown rule, a negative limit, or no trial qualifies (the message
            says what the closest trial has).
    """
    if pick not in PICKS:
        raise UserError(f"unknown rule {pick!r}; valid: {', '.join(PICKS)}", field="--pick")
    if max_instability is not None and not max_instability >= 0:
        raise UserError(f"must be >= 0, got {max_instability}", field="--max-instability")
    unit = _study_unit(unit, margin.limit if margin is not None else math.nan)
    pool, where = _candidates(rows, pick, max_instability, unit)
    best = min(pool, key=PICKS[pick].key)
    clear = [r for r in pool if margin is None or margin.keeps(r, unit)]
    row = min(clear, key=PICKS[pick].key) if clear else best
    facts = (f"memory saved {100 * row['memory_saved']:.2f}%, instability {unit.read(row).text()}, "
             f"{row.get('tokens_per_s') or 0:.0f} tokens/s")
    reason = f"trial {row['trial']} {PICKS[pick].verb} of {len(pool)} {where} ({facts})"
    return row, reason + _margin_note(margin, unit, row, best, clear)


def _candidates(rows: list[dict[str, Any]], pick: str, max_instability: float | None,
                unit: StudyUnit) -> tuple[list[dict[str, Any]], str]:
    """The rows ``pick`` may choose from, and how the reason sentence names them."""
    feasible = [r for r in rows if r.get("feasible") and not r.get("diverged")
                and _finite(r.get("instability")) and _finite(r.get("memory_saved"))]
    if not feasible:
        raise UserError(f"no feasible finished trial among {len(rows)} to pick from", field="--pick")
    pool = feasible if pick != "fastest" else [r for r in feasible if r.get("pareto")]
    where = "feasible trials" if pick != "fastest" else "trials on the Pareto front"
    if max_instability is None:
        return pool, where
    within = [r for r in pool if instability_in(r, unit) <= max_instability]
    if not within:
        best = min(pool, key=lambda r: instability_in(r, unit))
        raise UserError(
            f"none of the {len(pool)} {where} has instability <= {max_instability:g} {unit.name} (the study's "
            f"unit); the lowest is {unit.read(best).figure} (trial {best['trial']})", field="--max-instability")
    return within, where + f" with instability <= {max_instability:g} {unit_name(unit)}"


def _margin_note(margin: Margin | None, unit: StudyUnit, row: dict[str, Any], best: dict[str, Any],
                 clear: list[dict[str, Any]]) -> str:
    """What keeping the margin gave up, or that no candidate could keep it; empty when it changed nothing."""
    if margin is None or margin.share == 0:
        return ""
    within = f"within {100 * margin.share:g}% of the limit"
    if not clear:
        return (f"; every candidate is {within}, so it was taken anyway ({margin.describe(row, unit)}): "
                f"expect it to fail the limit in another seed")
    if row is best:
        return ""
    return (f"; picked trial {row['trial']} ({100 * row['memory_saved']:.2f}% saved, {margin.describe(row, unit)}) "
            f"over trial {best['trial']} ({100 * best['memory_saved']:.2f}% saved, {margin.describe(best, unit)}: "
            f"{within}); --margin 0 to take it")


__all__ = ["DEFAULT_MARGIN", "PICKS", "Margin", "Pick", "choose_trial", "instability_in", "unit_name"]
