"""Per-module search units: each block's GEMM units (and the output layer) take their own precision.

A space lists unit sets under ``search.units``; each set names unit kinds and,
optionally, the blocks it covers (index ranges over the probe's blocks)::

    search:
      units:
        - modules: [linear_qkv, linear_proj, linear_fc1, linear_fc2]
          blocks: ["0-3", 7]          # omit for every block of the probe
          precision: {choices: [bf16, fp8_current]}
        - modules: [output_layer]
          precision: {choices: [bf16, fp8_current]}
      sensitivity: {estimator: forward, budgets: 8}

Every unit a set covers becomes one searched parameter, ``precision.L<block>.<kind>``
(``precision.output_layer`` for the head), and one policy rule naming exactly that
unit (``decoder.layers.<block>.<kind>``), placed before the groups' rules so the
unit's own choice wins. The rules are plain :class:`~precsearch.policy.rules.Rule`
data, so ``policy.yaml`` and every export carry them as they carry groups.

``search.sensitivity`` turns on the sensitivity-guided start of a study
(:mod:`precsearch.search.guided`): every unit x precision is scored once, and the
assignments an integer program picks for a sweep of memory (or speed) budgets are queued as
the study's first trials.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from precsearch.arch.units import BLOCK_UNITS, OUTPUT_LAYER
from precsearch.config.knob import Knob, knob
from precsearch.config.section import Section
from precsearch.precision import Precision
from precsearch.recipes import DEFAULT_PRECISION
from precsearch.utils.numbers import MAX_COUNT

#: Unit kinds a set may name: the four GEMMs of a block, and the output layer.
KIND_SUFFIX: dict[str, str] = {suffix.rsplit(".", 1)[-1]: suffix for suffix in BLOCK_UNITS}
UNIT_KINDS = (*KIND_SUFFIX, OUTPUT_LAYER)
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


class UnitSet(Section):
    """Units that each take their own precision, from one list of choices."""

    modules: list[Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "output_layer"]] = Field(
        default_factory=lambda: list(KIND_SUFFIX), min_length=1,
        description="unit kinds: linear_qkv, linear_proj, linear_fc1, linear_fc2, output_layer")
    blocks: list[int | str] | None = Field(
        None, description="block indices or inclusive ranges such as '0-3' (default: every probe block)")
    precision: knob(Precision) = Knob(fixed=DEFAULT_PRECISION)

    @field_validator("blocks")
    @classmethod
    def _blocks_parse(cls, v: list[int | str] | None) -> list[int | str] | None:
        if v is not None:
            parse_blocks(v)
        return v

    @field_validator("modules")
    @classmethod
    def _unique_modules(cls, v: list[str]) -> list[str]:
        twice = sorted({m for m in v if v.count(m) > 1})
        if twice:
            raise ValueError(f"module kind {twice[0]!r} is listed twice")
        return v

    def block_indices(self, n_layers: int) -> list[int]:
        """The blocks this set covers (every block of an ``n_layers`` probe when unset)."""
        return list(range(n_layers)) if self.blocks is None else parse_blocks(self.blocks)


def parse_blocks(items: list[int | str]) -> list[int]:
    """``[0, "2-4"]`` -> ``[0, 2, 3, 4]``.

    Raises:
        ValueError: a negative index, a range written backwards, or text that is no range.
    """
    out: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{item!r} is not a block index; write an integer or a range such as '0-3'")
        if isinstance(item, int):
            if item < 0:
                raise ValueError(f"block {item} is negative; blocks count from 0")
            out.append(item)
            continue
        m = _RANGE.match(item)
        if not m:
            raise ValueError(f"{item!r} is neither a block index nor a range such as '0-3'")
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise ValueError(f"range {item!r} runs backwards; write '{hi}-{lo}'")
        out.extend(range(lo, hi + 1))
    return out


class SensitivitySection(Section):
    """The sensitivity pass and the candidates queued from it (see :mod:`precsearch.search.guided`)."""

    estimator: Literal["forward", "taylor"] = Field(
        "forward", description="forward: held-out loss with one unit switched, on a BF16-trained probe; "
        "taylor: diagonal-Fisher estimate from the same probe's output gradients")
    budgets: int = Field(8, ge=1, le=256, description="budgets swept up to the most the units can save")
    budget_on: Literal["memory", "speed"] = Field(
        "memory", description="memory: memory saved (objectives.memory); speed: predicted GEMM time saved "
        "(objectives.throughput)")
    eval_batches: int = Field(4, ge=1, le=MAX_COUNT, description="held-out batches each unit x precision is scored on")


@dataclass(frozen=True)
class SearchedUnit:
    """One unit with its own searched precision: its param, its rule name and its choices."""

    unit: str  # canonical name, decoder.layers.3.mlp.linear_fc1 or output_layer
    param: str  # the Optuna param, precision.L3.linear_fc1
    knob: Knob

    @property
    def rule_name(self) -> str:
        """The policy rule's name: the param without ``precision.`` (``L3.linear_fc1``, ``output_layer``)."""
        return self.param.removeprefix("precision.")


def searched_units(sets: list[UnitSet], n_layers: int) -> list[SearchedUnit]:
    """Every unit the sets cover, in execution order of the sets (blocks, then the output layer)."""
    out: list[SearchedUnit] = []
    for s in sets:
        for kind in s.modules:
            if kind == OUTPUT_LAYER:
                out.append(SearchedUnit(OUTPUT_LAYER, f"precision.{OUTPUT_LAYER}", s.precision))
                continue
            for i in s.block_indices(n_layers):
                out.append(SearchedUnit(f"decoder.layers.{i}.{KIND_SUFFIX[kind]}", f"precision.L{i}.{kind}",
                                        s.precision))
    return out


def unit_params_data(units: list[SearchedUnit]) -> dict[str, Any]:
    """Param -> choices, for messages and MLflow."""
    return {u.param: u.knob.to_data() for u in units}
