"""Checks on ``search.units`` and ``search.sensitivity`` that need the probe's shape.

Each raises :class:`UserError` naming the field.
"""

from __future__ import annotations

from precsearch.arch.units import OUTPUT_LAYER
from precsearch.config.space import Space
from precsearch.config.unit_space import searched_units
from precsearch.errors import UserError
from precsearch.precision import Precision


def check_units(space: Space) -> None:
    """Blocks inside the probe, no unit in two sets, no group named like a unit param, sensitivity usable."""
    n_layers = space.model.probe().n_layers
    seen: dict[str, int] = {}
    for i, unit_set in enumerate(space.search.units):
        past = [b for b in unit_set.block_indices(n_layers) if b >= n_layers]
        if past:
            raise UserError(f"block {past[0]} is past the probe's {n_layers} blocks (0 to {n_layers - 1})",
                            field=f"search.units[{i}].blocks")
        blocks = unit_set.block_indices(n_layers)
        twice = sorted({b for b in blocks if blocks.count(b) > 1})
        if twice:
            raise UserError(f"block {twice[0]} is selected twice", field=f"search.units[{i}].blocks")
        for unit in searched_units([unit_set], n_layers):
            if unit.unit in seen:
                raise UserError(f"{unit.unit} is already in search.units[{seen[unit.unit]}]; a unit takes one "
                                f"precision: list it in one set", field=f"search.units[{i}].modules")
            seen[unit.unit] = i
    if any(g.name == OUTPUT_LAYER for g in space.search.groups) and OUTPUT_LAYER in seen:
        raise UserError("a group named output_layer would share the param precision.output_layer with the unit; "
                        "rename the group", field="search.groups")
    _check_sensitivity(space, seen)


def _check_sensitivity(space: Space, units: dict[str, int]) -> None:
    sens = space.search.sensitivity
    if sens is None:
        return
    searched = [u for u in searched_units(space.search.units, space.model.probe().n_layers) if not u.knob.is_fixed]
    if not searched:
        raise UserError("the sensitivity pass scores per-module units, but search.units has none with "
                        "precision choices; add units or remove search.sensitivity", field="search.sensitivity")
    wanted = {"memory": "memory", "speed": "throughput"}[sens.budget_on]
    if not getattr(space.objectives, wanted):
        raise UserError(f"budget_on {sens.budget_on} trades predicted instability against {sens.budget_on}, which "
                        f"the study does not score; enable objectives.{wanted} or set budget_on to "
                        f"{'speed' if wanted == 'memory' else 'memory'}", field="search.sensitivity.budget_on")
