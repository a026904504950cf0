"""The layout of ``policy.yaml`` as pydantic models: what :func:`precsearch.policy.file.parse_policy` checks.

Every field keeps the rule it had when the file was checked by hand, and its message
(``expected a whole number from 1 to 65536, got 0``), so an error still names the field
(``policy.rules[2].precision``) and says what would be valid. The recipe and memory sections
take their keys from :class:`~precsearch.precision.LayerRecipe` and
:class:`~precsearch.policy.rules.MemoryKnobs`, so a field added there is accepted here. The
models only check; :meth:`Policy.from_dict` builds the policy from the same data.
"""

from __future__ import annotations

from dataclasses import fields
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainValidator, create_model, model_validator

from precsearch.policy.rules import FP8_ATTENTION, MemoryKnobs
from precsearch.storage import MASTER_DTYPES, MOMENT_DTYPES, STATE_DTYPES
from precsearch.precision import (MAX_AMAX_HISTORY, MAX_MARGIN, NVFP4_KNOBS, AmaxAlgo, Fp8Format, LayerRecipe,
                                  Precision)
from precsearch.utils.numbers import MAX_COUNT, number_problem


def shown(value: Any) -> str:
    """``repr(value)``, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expect(ok, what: str) -> PlainValidator:
    """A field that holds a value ``ok`` accepts, else fails with ``expected <what>, got <value>``."""
    def check(value: Any) -> Any:
        if not ok(value):
            raise ValueError(f"expected {what}, got {shown(value)}")
        return value

    return PlainValidator(check)


def _count(minimum: int, maximum: int = MAX_COUNT, *, optional: bool = False) -> Any:
    """A whole number in ``[minimum, maximum]`` (None too when ``optional``); bools are refused."""
    def ok(v: Any) -> bool:
        return (optional and v is None) or (_is_int(v) and minimum <= v <= maximum)

    what = (f"a whole number >= {minimum} (at most {maximum})" if maximum == MAX_COUNT
            else f"a whole number from {minimum} to {maximum}")
    return Annotated[int, _expect(ok, what)]


def _name(names: type[Enum] | tuple[str, ...]) -> Any:
    valid = [n.value for n in names] if isinstance(names, type) else list(names)
    return Annotated[str, _expect(lambda v: isinstance(v, str) and v in valid, f"one of {', '.join(valid)}")]


def _mapping(value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {shown(value)}")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _is_mapping(cls, value: Any) -> Any:
        return _mapping(value)


class LayersSection(_Section):
    """A rule's blocks (``layers``)."""

    first: _count(0, optional=True) = None
    last: _count(0, optional=True) = None
    indices: Annotated[Any, _expect(
        lambda v: v is None or (isinstance(v, list) and bool(v) and all(_is_int(i) and 0 <= i <= MAX_COUNT
                                                                         for i in v)),
        f"a non-empty list of block numbers from 0 to {MAX_COUNT} (an empty one selects no block)")] = None


class RuleSection(_Section):
    """One rule of ``policy.rules``."""

    name: Annotated[str, _expect(lambda v: isinstance(v, str), "a string")]
    modules: Annotated[list[str], _expect(lambda v: isinstance(v, list) and bool(v) and
                                          all(isinstance(m, str) for m in v), "a non-empty list of name patterns")]
    precision: _name(Precision)
    layers: Annotated[LayersSection, BeforeValidator(lambda v: v or {})] = None


_RECIPE_RULES: dict[str, Any] = {
    "fp8_format": _name(Fp8Format),
    "amax_history_len": _count(1, MAX_AMAX_HISTORY),
    "amax_compute_algo": _name(AmaxAlgo),
    "margin": _count(0, MAX_MARGIN),
    **{k: Annotated[bool, _expect(lambda v: isinstance(v, bool), "true or false")] for k in NVFP4_KNOBS},
}
_MEMORY_RULES: dict[str, Any] = {
    "master_weights": Annotated[bool, _expect(lambda v: isinstance(v, bool), "true or false")],
    "fp8_weights": Annotated[bool, _expect(lambda v: isinstance(v, bool), "true or false")],
    "moment_dtype": _name(MOMENT_DTYPES),
    "exp_avg_dtype": Annotated[Any, _expect(lambda v: v is None or v in STATE_DTYPES,
                                            f"null or one of {', '.join(STATE_DTYPES)}")],
    "exp_avg_sq_dtype": Annotated[Any, _expect(lambda v: v is None or v in STATE_DTYPES,
                                               f"null or one of {', '.join(STATE_DTYPES)}")],
    "master_dtype": _name(MASTER_DTYPES),
    "fp8_attention": _name(FP8_ATTENTION),
}


def _section(name: str, source: type, rules: dict[str, Any], skip: tuple[str, ...] = ()) -> type[_Section]:
    """A section whose keys are ``source``'s dataclass fields; those in ``rules`` are checked here, the
    others by ``source`` itself when the policy is built."""
    keys = {f.name: (rules.get(f.name, Any), None) for f in fields(source) if f.name not in skip}
    return create_model(name, __base__=_Section, **keys)


RecipeSection = _section("RecipeSection", LayerRecipe, _RECIPE_RULES, skip=("precision",))
MemorySection = _section("MemorySection", MemoryKnobs, _MEMORY_RULES)


class PolicySection(_Section):
    """The ``policy`` section: what :meth:`Policy.to_dict` writes."""

    default: _name(Precision) = "bf16"
    rules: Annotated[list[RuleSection], BeforeValidator(lambda v: _list_of_rules(v))] = ()
    recipe: RecipeSection = None
    warmup_steps: _count(0) = 0
    clip_grad: Annotated[Any, _expect(lambda v: v is None or (number_problem(v) is None and isinstance(v, (int, float))
                                                             and v > 0), "null or a number > 0, finite")] = None
    memory: MemorySection = None


def _list_of_rules(value: Any) -> Any:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of rules, got {shown(value)}")
    return value


class PolicyFile(_Section):
    """A whole ``policy.yaml``: ``schema_version``, ``policy``, ``provenance``."""

    schema_version: Any = None
    policy: PolicySection
    provenance: Annotated[Any, _expect(lambda v: not v or isinstance(v, dict), "a mapping")] = None

