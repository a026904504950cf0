"""The standard FP8 recipe's fixed-state reading: the point a trial's reading is set beside.

A figure such as ``update_norm 0.00157`` says nothing to a reader without the docs; "1.3x what the standard FP8
recipe does at the same states" does. The standard recipe is Megatron-Core's default FP8 training: FP8 delayed
scaling on every block Linear (the registry's :data:`~precsearch.recipes.STANDARD_FP8`, with the space's recipe
settings), the output layer in BF16, and the baseline's optimizer state (``objectives.baseline_memory``: FP32 master
weights and moments). Where the backend cannot run delayed scaling on this device, the next standard recipe stands
in (current scaling) and the description says so.

It is read by the same :class:`~precsearch.probe.damage.DamageReader` as the trials, so at the same states, on the
same batches and with the same BF16 side; once per clipping value per study (the worker keeps it beside the BF16
references: :mod:`precsearch.runtime.standard`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from precsearch.policy import MemoryKnobs, Policy
from precsearch.precision import LayerRecipe, Precision
from precsearch.recipes import DEFAULT_PRECISION, STANDARD_FP8, recipe_for, standard_fp8


def standard_policy(settings: Mapping[str, Any], supported: Mapping[Precision, str | None],
                    clip_grad: float | None, memory: MemoryKnobs, param_dtype: str) -> tuple[Policy, str] | None:
    """The standard FP8 recipe as a policy at ``clip_grad``, and its description; None where no standard recipe runs.

    Args:
        settings: The space's fixed recipe settings (:class:`LayerRecipe` fields; a searched one is not given and
            keeps its default, Transformer Engine's ``DelayedScaling`` default for the history settings).
        supported: The backend's answer per precision on this device: None where it runs, else why not.
        clip_grad: The clipping value of the trials it is compared with.
        memory: The baseline's optimizer state (``objectives.baseline_memory``, resolved).
        param_dtype: The probe's parameter dtype (``probe.param_dtype``), for the description.
    """
    recipe = standard_fp8(lambda p: p in supported and supported[p] is None)
    if recipe is None:
        return None
    policy = Policy.blocks_in(LayerRecipe(**{**settings, "precision": recipe.precision}), clip_grad, memory)
    return policy, describe(recipe.precision, supported, memory, param_dtype)


def describe(precision: Precision, supported: Mapping[Precision, str | None], memory: MemoryKnobs,
             param_dtype: str) -> str:
    """``FP8 delayed scaling on every block Linear, BF16 output layer, FP32 master and moments``; with a stand-in
    recipe, why the first choice is not run."""
    gemms = f"{recipe_for(precision).spec.label} on every block Linear"
    first = STANDARD_FP8[0]
    if precision != first:
        gemms += f" (this backend cannot run {recipe_for(first).spec.label} here: {supported.get(first)})"
    return f"{gemms}, {recipe_for(DEFAULT_PRECISION).spec.label} output layer, {optimizer_state(memory, param_dtype)}"


def optimizer_state(memory: MemoryKnobs, param_dtype: str) -> str:
    """The optimizer state in words: ``FP32 master and moments``, ``FP32 weights and moments`` (no master copy)."""
    moments = memory.moments(param_dtype).upper()
    weights = f"{param_dtype.upper()} weights" if memory.master == "none" else f"{memory.master.upper()} master"
    if weights.split()[0] == moments:
        return f"{weights} and moments"
    return f"{weights}, {moments} moments"
