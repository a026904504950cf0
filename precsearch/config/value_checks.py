"""Checks on values that parse but make no sense: each would fail late, do nothing, or train wrongly.

Every searched setting is checked over all the values it can take (a range by its two ends).
Each check raises :class:`UserError` naming the field.
"""

from __future__ import annotations

import math
import re

from precsearch.config.knob import Knob
from precsearch.config.data_source import TOKENIZED_SOURCES
from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.precision import MAX_AMAX_HISTORY, MAX_MARGIN


def check_values(space: Space) -> None:
    """The recipe, clipping and schedule checks, in the order a user would fix them."""
    _check_model_shape(space)
    _check_data_keys(space)
    _check_recipe(space)
    _check_edge_blocks(space)
    _check_clip(space.search.clip_grad)
    _check_lr_warmup(space)
    _check_limit(space)


def _check_model_shape(space: Space) -> None:
    try:
        target = space.model.target()
    except ValueError as exc:
        named = re.findall(r"model\.(\w+)", str(exc))
        # "model.dim (64) must be divisible by model.n_heads (3)": the divisor is the field to change
        raise UserError(str(exc), field=f"model.{named[-1]}" if named else "model") from None
    layers = space.model.probe_layers
    if layers is not None and layers > target.n_layers:
        raise UserError(f"probe_layers {layers} exceeds model.n_layers {target.n_layers}: the probe is the target "
                        f"with fewer blocks; valid: 1 to {target.n_layers}", field="model.probe_layers")


def _check_data_keys(space: Space) -> None:
    """A path or tokenizer the source never reads: the user believes the probe trains on their file."""
    data = space.data
    source = data.source.value
    if data.path is not None and source in ("stdlib", "synthetic"):
        raise UserError(f"source '{source}' does not read a file, so this path would be ignored; for a file give "
                        f"source tokens (.npy/.bin), text, megatron, hf_disk or jsonl", field="data.path")
    if data.tokenizer is not None and data.source not in TOKENIZED_SOURCES:
        raise UserError(f"only sources text, jsonl and hf_disk are tokenized; with source '{source}' the tokenizer "
                        f"would be ignored", field="data.tokenizer")
    if "field" in data.model_fields_set and source not in ("jsonl", "hf_disk"):
        raise UserError(f"only sources jsonl and hf_disk read a field; with source '{source}' it would be ignored",
                        field="data.field")


def _check_recipe(space: Space) -> None:
    recipe = space.search.recipe
    history = recipe.amax_history_len.options()
    if min(history) < 1 or max(history) > MAX_AMAX_HISTORY:
        raise UserError(f"amax history lengths {_shown(recipe.amax_history_len)}: each must be >= 1 (steps of amax "
                        f"kept) and at most {MAX_AMAX_HISTORY} (TE's default is 1024)",
                        field="search.recipe.amax_history_len")
    margins = recipe.margin.options()
    if min(margins) < 0:
        raise UserError(f"margins {_shown(recipe.margin)}: each must be >= 0 (the scale is divided by 2**margin)",
                        field="search.recipe.margin")
    if max(margins) > MAX_MARGIN:
        raise UserError(f"margin {max(margins)} would flush every value to zero (448 x 2**-{max(margins)} is below "
                        f"E4M3's smallest subnormal); valid: 0 to {MAX_MARGIN}", field="search.recipe.margin")


def _check_edge_blocks(space: Space) -> None:
    edges = space.search.bf16_blocks
    for name in ("first", "last"):
        if min(getattr(edges, name).options()) < 0:
            raise UserError(f"bf16_blocks.{name} {_shown(getattr(edges, name))}: each must be >= 0 (blocks kept "
                            "BF16 at that end)", field=f"search.bf16_blocks.{name}")
    layers = space.model.probe().n_layers
    most = max(edges.first.options()) + max(edges.last.options())
    if most >= layers:
        raise UserError(f"up to {most} BF16 edge blocks leave no low-precision block in the {layers}-block probe; "
                        f"valid: first + last < {layers}", field="search.bf16_blocks")


def _check_clip(clip: Knob) -> None:
    for value in clip.options():
        if value is None:
            continue
        if not math.isfinite(value):
            raise UserError(f"{value} is not a finite clipping threshold; for no clipping write null",
                            field="search.clip_grad")
        if value <= 0:
            raise UserError(f"clip_grad {value} must be > 0 (0 zeroes every update, a negative value reverses it: "
                            f"gradient ascent); for no clipping write null", field="search.clip_grad")


def _check_lr_warmup(space: Space) -> None:
    probe = space.probe
    fidelity = space.study.fidelity
    steps = max(fidelity.rungs) if fidelity else probe.steps  # the schedule spans the longest rung
    if probe.lr_warmup_steps >= steps:
        raise UserError(f"an LR warm-up of {probe.lr_warmup_steps} steps never reaches probe.lr in a {steps}-step "
                        f"run; valid: fewer than {steps} (probe.steps{' or the longest rung' if fidelity else ''})",
                        field="probe.lr_warmup_steps")


def _check_limit(space: Space) -> None:
    objectives = space.objectives
    limit = objectives.stability_limit
    if objectives.stability_unit == "relative" and limit >= 1:
        raise UserError(f"{limit:g} is {100 * limit:g}% of the BF16 loss (stability_unit relative): every trial "
                        f"that does not diverge would pass; for {limit:g}% write {limit / 100:g}",
                        field="objectives.stability_limit")


def _shown(knob: Knob) -> str:
    return str(knob.to_data())
