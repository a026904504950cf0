"""From a space and an Optuna trial to a :class:`Policy`.

Param names are short and flat so that they read well as MLflow params:
``precision.<group>``, ``precision.default``, ``recipe.<setting>``,
``warmup_steps``, ``clip_grad``, ``memory.<knob>``. Fixed knobs make no param.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import optuna

from precsearch.config.space import Space
from precsearch.policy.rules import MemoryKnobs, Policy
from precsearch.precision import LayerRecipe


def suggest_policy(space: Space, trial: optuna.Trial | optuna.trial.FixedTrial) -> Policy:
    """Ask ``trial`` for every searched knob of ``space`` and build the policy."""
    search = space.search
    rules = tuple(g.to_rule(g.precision.suggest(trial, f"precision.{g.name}")) for g in search.groups)
    recipe = LayerRecipe(
        fp8_format=search.recipe.fp8_format.suggest(trial, "recipe.fp8_format"),
        amax_history_len=search.recipe.amax_history_len.suggest(trial, "recipe.amax_history_len"),
        amax_compute_algo=search.recipe.amax_compute_algo.suggest(trial, "recipe.amax_compute_algo"),
        margin=search.recipe.margin.suggest(trial, "recipe.margin"),
    )
    return Policy(
        rules=rules,
        default=search.default_precision.suggest(trial, "precision.default"),
        recipe=recipe,
        warmup_steps=search.warmup_steps.suggest(trial, "warmup_steps"),
        clip_grad=search.clip_grad.suggest(trial, "clip_grad"),
        memory=MemoryKnobs(**{f.name: getattr(search.memory, f.name).suggest(trial, f"memory.{f.name}")
                              for f in fields(MemoryKnobs)}),
    )


def policy_from_params(space: Space, params: dict[str, Any]) -> Policy:
    """Rebuild the policy a finished trial ran, from its stored params."""
    return suggest_policy(space, optuna.trial.FixedTrial(params))
