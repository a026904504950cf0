"""From a space and an Optuna trial to a :class:`Policy`.

Param names are short and flat so that they read well as MLflow params:
``precision.<group>``, ``precision.L<block>.<unit>`` (per-module units), ``precision.default``,
``recipe.<setting>``, ``warmup_steps``, ``clip_grad``, ``memory.<knob>``, ``bf16_blocks.first``/``.last``.
Fixed knobs make no param, and neither does a recipe setting or the FP8 warm-up in a trial whose layers
run no precision that reads it (:mod:`precsearch.config.inert`): it takes its first value. Rules are
matched first to last: the BF16 end blocks first (they override a unit's choice in those blocks), then the
per-module units, then the groups.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import optuna

from precsearch.config.inert import inert_in, knob_at
from precsearch.config.space import Space
from precsearch.config.unit_space import searched_units
from precsearch.policy.rules import MemoryKnobs, Policy, Rule
from precsearch.precision import LayerRecipe
from precsearch.recipes import DEFAULT_PRECISION, SETTINGS

#: The ``search.recipe`` settings, each a field of :class:`LayerRecipe` (the recipes' :data:`SETTINGS`).
RECIPE_SETTINGS = SETTINGS


def suggest_policy(space: Space, trial: optuna.Trial | optuna.trial.FixedTrial) -> Policy:
    """Ask ``trial`` for every searched knob of ``space`` and build the policy."""
    search = space.search
    rules = edge_rules(search.bf16_blocks.first.suggest(trial, "bf16_blocks.first"),
                       search.bf16_blocks.last.suggest(trial, "bf16_blocks.last"))
    units = searched_units(search.units, space.model.probe().n_layers)
    rules += tuple(Rule(u.rule_name, (u.unit,), u.knob.suggest(trial, u.param)) for u in units)
    rules += tuple(g.to_rule(g.precision.suggest(trial, f"precision.{g.name}")) for g in search.groups)
    default = search.default_precision.suggest(trial, "precision.default")
    # a setting no layer of this trial reads is not asked for: trials differing only there are duplicates
    inert = inert_in({r.precision for r in rules} | {default})

    def pick(name: str) -> Any:
        knob = knob_at(space, name)
        return knob.options()[0] if name in inert else knob.suggest(trial, name)

    recipe = LayerRecipe(**{k: pick(f"recipe.{k}") for k in RECIPE_SETTINGS})
    return Policy(
        rules=rules,
        default=default,
        recipe=recipe,
        warmup_steps=pick("warmup_steps"),
        clip_grad=search.clip_grad.suggest(trial, "clip_grad"),
        memory=MemoryKnobs(**{f.name: getattr(search.memory, f.name).suggest(trial, f"memory.{f.name}")
                              for f in fields(MemoryKnobs)}),
    )


def edge_rules(first: int, last: int) -> tuple[Rule, ...]:
    """Rules keeping the ``first`` and ``last`` blocks whole in BF16; tried before every group."""
    rules = []
    if first:
        rules.append(Rule("bf16_first_blocks", ("*",), DEFAULT_PRECISION, first=first))
    if last:
        rules.append(Rule("bf16_last_blocks", ("*",), DEFAULT_PRECISION, last=last))
    return tuple(rules)


def policy_from_params(space: Space, params: dict[str, Any]) -> Policy:
    """Rebuild the policy a finished trial ran, from its stored params."""
    return suggest_policy(space, optuna.trial.FixedTrial(params))
