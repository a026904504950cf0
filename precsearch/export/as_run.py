"""What a training framework runs of an exported policy, and how that differs from the trial.

Every format says what its files make the framework run (:class:`AsRun`: each precision unit's
precision and the memory knobs written), read back from the files it writes where it can (Megatron's
flags and matchers, torchtitan's ``filter_fqns``) rather than from the policy. :func:`describe_changes`
compares that with the trial's policy, per module and per knob, in the words ``precsearch export``
prints before it writes. What the difference costs in memory is predicted outside this package (export
knows no memory model): :mod:`precsearch.runtime.export_cost`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from precsearch.arch.units import BLOCK_UNITS, OUTPUT_LAYER
from precsearch.export.format_output import describe_by_block
from precsearch.policy.rules import MemoryKnobs, Policy
from precsearch.precision import Fp8Format, Precision
from precsearch.recipes import recipe_for


@dataclass(frozen=True)
class AsRun:
    """A policy as a framework runs it.

    Attributes:
        precisions: Precision unit name (``decoder.layers.3.mlp.linear_fc1``, ``output_layer``) -> the
            precision it runs, for every unit of the model.
        memory: The memory knobs the framework applies (what the files write, or what it does anyway).
        warmup_steps: The BF16 steps the files run before low precision switches on (0 where the framework
            has no warm-up setting); None where not said (a baseline).
        fp8_format: The FP8 format (hybrid: E5M2 gradients) the framework runs for the FP8 layers; None where
            not said.
    """

    precisions: dict[str, Precision]
    memory: MemoryKnobs
    warmup_steps: int | None = None
    fp8_format: Fp8Format | None = None


def unit_list(n_layers: int) -> list[str]:
    """Every precision unit of an ``n_layers``-block Llama 3, blocks first, then ``output_layer``."""
    return [f"decoder.layers.{i}.{suffix}" for i in range(n_layers) for suffix in BLOCK_UNITS] + [OUTPUT_LAYER]


def as_searched(policy: Policy, n_layers: int) -> AsRun:
    """The trial's own policy: what the probe ran (and what ``policy.yaml`` keeps)."""
    return AsRun({u: policy.precision_for(u, n_layers) for u in unit_list(n_layers)}, policy.memory,
                 policy.warmup_steps, policy.recipe.fp8_format)


def _knob_view(memory: MemoryKnobs, param_dtype: str) -> dict[str, str]:
    """The memory knobs as the state they keep, for ``param_dtype`` parameters (name -> value): with FP32
    parameters, FP32 master weights and moments are the defaults' state (:meth:`MemoryKnobs.resolved`)."""
    memory = memory.resolved(param_dtype)
    first, second = memory.moment_dtypes(param_dtype)
    return {"master weights": memory.master, "first moment": first, "second moment": second,
            "fp8_weights": str(memory.fp8_weights).lower(), "fp8_attention": memory.fp8_attention}


def _modules(units: list[str]) -> str:
    """``mlp.linear_fc1 in blocks 0-3, 7; output_layer``: a short account of unit names."""
    return describe_by_block(units, lambda unit: unit.split(".", 3)[3], BLOCK_UNITS)


def describe_changes(trial: AsRun, written: AsRun, param_dtype: str) -> list[str]:
    """One line per change: modules whose precision changes (trial's -> run), then each memory knob
    (trial's -> written), the FP8 warm-up and the FP8 format (where both sides say them and some layer runs
    FP8); empty when the framework runs the trial's policy as it is.

    ``param_dtype``: the probe's parameter dtype, which ``param`` moments follow.
    """
    moved: dict[tuple[Precision, Precision], list[str]] = defaultdict(list)
    for unit, had in trial.precisions.items():
        runs = written.precisions[unit]
        if runs is not had:
            moved[had, runs].append(unit)
    lines = [f"{len(units)} module(s) {had.value} -> {runs.value}: {_modules(units)}"
             for (had, runs), units in moved.items()]
    before, after = _knob_view(trial.memory, param_dtype), _knob_view(written.memory, param_dtype)
    lines += [f"{knob}: {before[knob]} -> {after[knob]}" for knob in before if before[knob] != after[knob]]
    low = any(p.is_fp8 for p in trial.precisions.values())
    if low and None not in (trial.warmup_steps, written.warmup_steps) and trial.warmup_steps != written.warmup_steps:
        lines.append(f"FP8 warm-up: {trial.warmup_steps} -> {written.warmup_steps} steps")
    encoded = any(recipe_for(p).fp8_encoded for p in written.precisions.values())
    if encoded and None not in (trial.fp8_format, written.fp8_format) and trial.fp8_format is not written.fp8_format:
        lines.append(f"fp8_format: {trial.fp8_format.value} -> {written.fp8_format.value}")
    return lines


__all__ = ["AsRun", "as_searched", "describe_changes", "unit_list"]
