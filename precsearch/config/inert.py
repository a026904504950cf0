"""Settings that another setting makes inert: one rule table, read by ``validate`` and by the sampler.

A searched setting that does nothing spends trials on policies that differ only in it, score alike and
crowd the front (the quickstart searched ``amax_history_len`` beside ``amax_compute_algo: most_recent``,
which reads only the newest amax). Each :class:`Inert` row says which setting does nothing when what:

* when another **setting** takes a value (``amax_history_len`` under ``most_recent``): if every value
  that setting can take makes it inert, or if both are searched, ``validate`` refuses the space, naming
  both fields and their values (for the history and the algorithm the advice loses nothing:
  ``most_recent`` is ``max`` over a history of 1);
* when the trial's layers run no **precision that reads it** (the delayed-scaling settings without an
  ``fp8_delayed`` layer, the NVFP4 switches without an ``nvfp4`` one, the FP8 format with only BF16, rowwise and
  NVFP4, the FP8 warm-up with only BF16): if no group, unit or default can run a reader, ``validate``
  refuses the space; otherwise the sampler leaves the recipe setting out of the trials whose layers run
  no reader (:func:`inert_in`), so such a trial has no param for it, takes the setting's first value, and
  a second trial differing only there is the first's duplicate, not a new probe. (The warm-up stays
  sampled in an all-BF16 trial: see its row.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from precsearch.config.knob import Knob
from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.precision import AmaxAlgo, Precision
from precsearch.readings import get_reading
from precsearch.recipes import SETTINGS, low_recipes, readers, recipe_for

#: ``Inert.by`` for rules on the precisions a trial's layers run, rather than on another setting.
PRECISIONS = "precisions"

LOW_PRECISION = frozenset(r.precision for r in low_recipes())

#: Why a recipe setting is inert where no layer runs a recipe that reads it (by the recipes' ``settings``).
_WHY_UNREAD = {
    "fp8_format": "BF16 and the fixed-format recipes (NVFP4: E2M1 with E4M3 scales) have no FP8 format to choose",
}


@dataclass(frozen=True)
class Inert:
    """``setting`` (a path under ``search``) does nothing in a trial where ``by`` makes it so.

    Attributes:
        setting: The setting that can be inert, as its trial param is named (``recipe.amax_history_len``).
        by: Another setting's path, or :data:`PRECISIONS`.
        inert: For another setting: whether its value makes ``setting`` inert. For :data:`PRECISIONS`:
            whether the set of precisions a trial's layers run does (it holds no reader).
        when: The inert-making value in words (``most_recent``; for precisions, the readers).
        because: Why, for the message (``most_recent reads only the newest amax``).
        instead: What to write instead, when both settings are searched (setting rules only).
        collapse: Precision rules: whether the sampler leaves the setting out of a trial whose layers run no
            reader (:func:`inert_in`); False keeps it sampled there (validation still refuses a space in
            which no layer can run a reader).
    """

    setting: str
    by: str
    inert: Callable[[Any], bool]
    when: str
    because: str
    instead: str = ""
    collapse: bool = True


def _reads_none(readers: frozenset[Precision]) -> Callable[[set[Precision]], bool]:
    return lambda running: not (set(running) & readers)


def _readers(readers: frozenset[Precision]) -> str:
    return " or ".join(sorted(p.value for p in readers))


def _labels(precisions: frozenset[Precision]) -> str:
    return " or ".join(sorted(recipe_for(p).spec.label for p in precisions))


_HISTORY_FOR_ALGO = ("most_recent is max over a history of 1: fix search.recipe.amax_compute_algo: max and "
                     "include 1 in search.recipe.amax_history_len's choices")

RULES: tuple[Inert, ...] = (
    *(Inert(f"recipe.{name}", PRECISIONS, _reads_none(readers(name)), _readers(readers(name)),
            _WHY_UNREAD.get(name, f"only {_labels(readers(name))} reads it")) for name in SETTINGS),
    # kept sampled: only the all-BF16 trial is affected, and leaving it out there would change the number of
    # distinct policies of every space that searches the warm-up (the smoke space's 12 would become 11)
    Inert("warmup_steps", PRECISIONS, _reads_none(LOW_PRECISION), _readers(LOW_PRECISION),
          "the warm-up delays low precision, and BF16 layers have none to delay", collapse=False),
    Inert("recipe.amax_history_len", "recipe.amax_compute_algo", lambda v: AmaxAlgo(v) is AmaxAlgo.MOST_RECENT,
          "most_recent", "most_recent reads only the newest amax", _HISTORY_FOR_ALGO),
    Inert("recipe.amax_compute_algo", "recipe.amax_history_len", lambda v: v == 1, "1",
          "a history of one amax is its own max and its newest", _HISTORY_FOR_ALGO),
)
"""Every way a searched setting can do nothing; checked in this order (no delayed layer at all is said before
what ``most_recent`` does to the history)."""


def knob_at(space: Space, path: str) -> Knob:
    """The knob at ``path`` under ``search`` (``recipe.margin``)."""
    node: Any = space.search
    for part in path.split("."):
        node = getattr(node, part)
    return node


def possible_precisions(space: Space) -> set[Precision]:
    """Every precision some layer of some trial can run: groups, per-module units and the default."""
    return space.search.precisions() | {p for u in space.search.units for p in u.precision.options()}


def check_inert(space: Space) -> None:
    """Refuse a space that searches a setting another setting makes inert (see the module docstring).

    Raises:
        UserError: Naming the inert setting (the field), the setting that makes it so and their values.
    """
    running = possible_precisions(space)
    for rule in RULES:
        knob = knob_at(space, rule.setting)
        if knob.is_fixed:
            continue
        field, searched = f"search.{rule.setting}", _shown(knob)
        if rule.by == PRECISIONS:
            if rule.inert(running):
                offered = ", ".join(sorted(p.value for p in running))
                raise UserError(f"searched as {searched}, but {rule.because} and no layer can run {rule.when} "
                                f"(search.groups, search.units and search.default_precision offer {offered}): "
                                f"every trial would run the same; fix it, or offer {rule.when}", field=field)
            continue
        _check_pair(rule, field, searched, knob_at(space, rule.by))


def _check_pair(rule: Inert, field: str, searched: Any, other: Knob) -> None:
    inert = [v for v in other.options() if rule.inert(v)]
    if not inert:
        return
    by = f"search.{rule.by}"
    if len(inert) == len(other.options()):
        raise UserError(f"searched as {searched}, but {by} is {_shown(other)}, and under {rule.when} it does "
                        f"nothing ({rule.because}): every trial would run the same; fix {field}, or change "
                        f"{by}", field=field)
    raise UserError(f"searched as {searched} beside {by} {_shown(other)}: under {rule.when} it does nothing "
                    f"({rule.because}), so trials differing only in it would score alike; {rule.instead}",
                    field=field)


def _shown(knob: Knob) -> str:
    """A knob as a space file writes it: ``{choices: [16, 1024]}``, ``most_recent``."""
    text = yaml.safe_dump(knob.to_data(), default_flow_style=True, sort_keys=False, width=10**6)
    return text.strip().removesuffix("\n...")


def reading_warnings(space: Space) -> list[str]:
    """Searched values the study's reading cannot tell apart, though the probe's training can: amax histories at
    least as long as the passes a fixed-state reading makes at a state (16 and 1024 read alike at 6 passes; the
    quickstart of 2026-12-07 spent two trials that differed only there and read 2.95e-05 both). Not refused: the
    probe's loss gap, spikes and non-finite checks still see the history."""
    knob = space.search.recipe.amax_history_len
    per_state = get_reading(space.objectives.reading).passes_per_state(space.objectives)
    if knob.choices is None or per_state is None:
        return []
    passes, fields = per_state
    alike = sorted(v for v in knob.choices if v >= passes)
    if len(alike) < 2:
        return []
    return [f"search.recipe.amax_history_len {_shown(knob)}: {', '.join(map(str, alike))} read alike under "
            f"objectives.reading: {space.objectives.reading}, which quantizes {passes} passes a state from fresh "
            f"scalers ({fields}), so any history of {passes} or more holds them all; the probe's training still "
            f"tells them apart. Keep one of them, or read more passes a state"]


def inert_in(running: set[Precision]) -> set[str]:
    """The settings a trial whose layers run ``running`` leaves unsampled: the precision rules' settings that
    none of those precisions reads (the setting rules are refused by :func:`check_inert` instead)."""
    return {r.setting for r in RULES if r.by == PRECISIONS and r.collapse and r.inert(running)}


__all__ = ["Inert", "PRECISIONS", "RULES", "check_inert", "inert_in", "knob_at", "possible_precisions"]
