"""A space against its ``target:`` (``precsearch validate``), and which targets run a trial's policy as it is.

What a target runs of a policy is its export format's reading of the files it writes
(:func:`~precsearch.export.registry.cannot_express`); this module asks it about each choice a space offers.

A choice (a precision of a group, unit set or the default; a recipe setting; the FP8 warm-up; clipping; a
memory knob) is asked in **contexts**: the rest of the model BF16 or at each low precision the space
offers, and, for a memory knob, each value the space offers for the other memory knobs. In each context
the policy with the choice is compared with the same policy without it (the setting at precsearch's
default: BF16, no warm-up, hybrid format, plain AdamW); a context the target cannot run as it is, or in
which the choice changes nothing (a delayed-scaling setting beside fp8_current layers), says nothing. A
choice is refused when every context that says something finds the target running it otherwise: so a
choice the target runs only beside some other choice (an MXFP8 head beside MXFP8 blocks in Megatron) is
offered, and the front and the export name the trials whose combination it cannot run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from precsearch.arch.units import OUTPUT_LAYER
from precsearch.config.inert import inert_in, knob_at, possible_precisions
from precsearch.config.model_section import ModelSection
from precsearch.config.space import Space
from precsearch.config.unit_space import searched_units
from precsearch.errors import UserError, UserErrors
from precsearch.export.registry import FORMATS, TARGETS, cannot_express, render, version_problem
from precsearch.policy.rules import MemoryKnobs, Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.recipes import DEFAULT_PRECISION

if TYPE_CHECKING:  # validate imports this module: no optuna, no torch (tests/test_lazy_imports.py)
    import optuna
    from optuna.trial import FrozenTrial

#: The ``search.recipe`` settings (fields of :class:`LayerRecipe` a space searches).
RECIPE_SETTINGS = tuple(f.name for f in fields(LayerRecipe) if f.name != "precision")


@dataclass(frozen=True)
class Choice:
    """One value a space offers for one setting, as the policies that differ only in it.

    Attributes:
        field: The space file's field (``search.memory.moment_dtype``).
        value: The value, as the file writes it.
        contexts: (policy with the choice, the same policy without it), one pair per context.
    """

    field: str
    value: str
    contexts: list[tuple[Policy, Policy]]


def check_target(space: Space, *, file: str) -> None:
    """Refuse a space that offers what its ``target:`` cannot run, listing every such choice.

    Raises:
        UserErrors: One line per (field, value): the target, what it runs instead and its export's why.
    """
    if space.target is None:
        return
    problems = target_problems(space)
    if problems:
        raise UserErrors([p.located(file=file) for p in problems])


def target_problems(space: Space) -> list[UserError]:
    """Every problem of ``space`` against its target: the version, then each choice it cannot run."""
    target = space.target
    fmt = TARGETS[target.name]
    version = target.version or FORMATS[fmt].checked
    problems = []
    if (why := version_problem(fmt, version)) is not None:
        problems.append(UserError(f"{why}; valid: a version in that span, or leave version out",
                                  field="target.version"))
    n_layers, dtype = space.model.probe().n_layers, space.probe.param_dtype
    for choice in choices(space):
        changes = _changes(fmt, choice, n_layers, dtype)
        if changes is not None:
            problems.append(UserError(_message(target.name, version, choice, changes, fmt, n_layers),
                                      field=choice.field))
    return problems


def _changes(fmt: str, choice: Choice, n_layers: int, dtype: str) -> tuple[Policy, Policy, list[str]] | None:
    """(with, without, the changes it adds) of the first context, when every context that says something finds
    the target running the choice otherwise; None when one runs it as it is (or none says anything)."""
    found = None
    for with_it, without in choice.contexts:
        before = cannot_express(fmt, without, n_layers, dtype)
        if before or with_it == without:
            continue  # the target cannot run the context itself, or the choice changes nothing here
        added = [c for c in cannot_express(fmt, with_it, n_layers, dtype) if c not in before]
        if not added:
            return None
        found = found or (with_it, without, added)
    return found


def _message(name: str, version: str, choice: Choice, found: tuple[Policy, Policy, list[str]], fmt: str,
             n_layers: int) -> str:
    with_it, without, added = found
    known = set(render(fmt, without, n_layers).warnings)
    why = [w for w in render(fmt, with_it, n_layers).warnings if w not in known]
    text = f"offers {choice.value}, which target {name} ({version}) cannot run as the probe does: it runs " + \
        "; ".join(added)
    text += f" (its export: {' / '.join(why)})" if why else ""
    return text + f"; valid: leave {choice.value} out for {name}, or target precsearch"


def choices(space: Space) -> Iterator[Choice]:
    """Every value every setting of ``space`` can take that precsearch's default does not, with its contexts."""
    search, n_layers = space.search, space.model.probe().n_layers
    around = _contexts(space)
    low = [c for c in around if c.default.is_fp8]
    for p in _non_default(search.default_precision.options(), DEFAULT_PRECISION):
        yield Choice("search.default_precision", p.value, [(replace(c, default=p), c) for c in around])
    for i, group in enumerate(search.groups):
        for p in _non_default(group.precision.options(), DEFAULT_PRECISION):
            yield Choice(f"search.groups[{i}].precision", f"{p.value} for group {group.name}",
                         [(replace(c, rules=(group.to_rule(p), *c.rules)), c) for c in around])
    yield from _unit_choices(space, around, n_layers)
    for name in RECIPE_SETTINGS:
        for v in _non_default(knob_at(space, f"recipe.{name}").options(), getattr(LayerRecipe(), name)):
            yield Choice(f"search.recipe.{name}", _shown(v), [
                (replace(c, recipe=replace(c.recipe, **{name: v})), c) for c in low
                if f"recipe.{name}" not in inert_in({c.default})])
    for v in _non_default(search.warmup_steps.options(), 0):
        yield Choice("search.warmup_steps", _shown(v), [(replace(c, warmup_steps=v), c) for c in low])
    for v in _non_default(search.clip_grad.options(), None):
        yield Choice("search.clip_grad", _shown(v), [(replace(c, clip_grad=v), c) for c in around])
    # the memory knobs meet the precisions only in Megatron's main parameters (which recipe): one context each
    yield from _memory_choices(space, list({c.default: c for c in reversed(around) if c.rules}.values()))


def _contexts(space: Space) -> list[Policy]:
    """The policies a choice is asked beside: every layer BF16, or at a low precision the space offers (with
    the output layer too, or BF16), with each FP8 format the space offers."""
    low = sorted((p for p in possible_precisions(space) if p.is_fp8), key=list(Precision).index)
    head = (Rule("head_bf16", (OUTPUT_LAYER,), DEFAULT_PRECISION),)
    formats = _non_default(knob_at(space, "recipe.fp8_format").options(), None)
    out = [Policy(rules=head)]
    for q in low:
        out += [Policy(rules=rules, default=q, recipe=LayerRecipe(fp8_format=f)) for rules in ((), head)
                for f in formats]
    return out


def _unit_choices(space: Space, around: list[Policy], n_layers: int) -> Iterator[Choice]:
    """Per-module unit sets: each kind of unit once (its first block), every precision it offers."""
    for i, unit_set in enumerate(space.search.units):
        seen = set()
        for unit in searched_units([unit_set], n_layers):
            kind = unit.unit.rsplit(".", 1)[-1]
            if kind in seen:
                continue
            seen.add(kind)
            for p in _non_default(unit.knob.options(), DEFAULT_PRECISION):
                rule = Rule(unit.rule_name, (unit.unit,), p)
                yield Choice(f"search.units[{i}].precision", f"{p.value} for {kind}",
                             [(replace(c, rules=(rule, *c.rules)), c) for c in around])


def _memory_choices(space: Space, around: list[Policy]) -> Iterator[Choice]:
    """Each memory knob's values, beside the space's first values of the others, and each value it offers for
    another memory knob (one at a time)."""
    offered = {f.name: getattr(space.search.memory, f.name).options() for f in fields(MemoryKnobs)}
    first = MemoryKnobs(**{name: values[0] for name, values in offered.items()})
    dtype = space.probe.param_dtype
    for name, values in offered.items():
        bases = [MemoryKnobs(), first] + [replace(b, **{o: v}) for b in (MemoryKnobs(), first)
                                          for o, vs in offered.items() if o != name for v in vs]
        for v in _non_default(values, getattr(MemoryKnobs(), name)):
            pairs = []
            for base in bases:
                with_it = replace(base, **{name: v})
                if with_it.resolved(dtype) != base.resolved(dtype):  # the knob does something beside base
                    pairs += [(replace(c, memory=with_it), replace(c, memory=base)) for c in around]
            yield Choice(f"search.memory.{name}", _shown(v), pairs)


def _non_default(values: list[Any], default: Any) -> list[Any]:
    out = []
    for v in values:
        if v != default and v not in out:
            out.append(v)
    return out


def _shown(value: Any) -> str:
    """A value as a space file writes it: ``true``, ``null``, ``e4m3``, ``10``."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(getattr(value, "value", value))


def runs_as_is(policy: Policy, n_layers: int, param_dtype: str = "fp32") -> list[str]:
    """The targets that run ``policy`` as the probe ran it (precsearch always does)."""
    return [name for name, fmt in TARGETS.items() if not cannot_express(fmt, policy, n_layers, param_dtype)]


@lru_cache(maxsize=4096)
def _runs_as_is_cached(policy_json: str, n_layers: int, param_dtype: str) -> str:
    return ", ".join(runs_as_is(Policy.from_dict(json.loads(policy_json)), n_layers, param_dtype))


def add_runs_as_is(rows: list[dict[str, Any]], policy_of: Callable[[dict[str, Any]], dict[str, Any] | None],
                   space: dict[str, Any]) -> list[dict[str, Any]]:
    """``rows`` (of :func:`~precsearch.search.front.trial_rows`), each with ``runs_as_is_in``: the targets that
    run its trial's policy (``policy_of(row)``, as data) as it is at the target model of ``space`` (as stored)
    (``precsearch, accelerate``; "" where the trial has no recorded policy); with a ``target:``, also
    ``target_memory_saved``, what the target's run of it saves, predicted
    (:func:`~precsearch.runtime.target_memory.target_memory_saved`). Returns ``rows``; unchanged for a space
    this version cannot read (a stored study's, or a checkpoint gone)."""
    try:
        n_layers = ModelSection(**space.get("model", {})).target().n_layers
    except (UserError, ValueError, TypeError):
        return rows
    dtype = space.get("probe", {}).get("param_dtype", "fp32")
    target = (space.get("target") or {}).get("name")
    shape = json.dumps({k: space.get(k) for k in ("model", "probe", "objectives")}, sort_keys=True, default=str)
    for row in rows:
        policy = policy_of(row)
        text = json.dumps(policy, sort_keys=True) if policy is not None else None
        row["runs_as_is_in"] = "" if text is None else _runs_as_is_cached(text, n_layers, dtype)
        if target in TARGETS and text is not None:
            row["target_memory_saved"] = _saved_cached(text, shape, target)
    return rows


@lru_cache(maxsize=4096)
def _saved_cached(policy_json: str, shape_json: str, target: str) -> float:
    from precsearch.runtime.target_memory import target_memory_saved  # the memory model: only with a target

    return target_memory_saved(json.loads(shape_json), target, Policy.from_dict(json.loads(policy_json)))


def runs_as_is_of_study(study: optuna.Study, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`add_runs_as_is` with the policies the study recorded."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    return add_runs_as_is(rows, lambda row: recorded_policy(trials, row["trial"]),
                          study.user_attrs.get("space", {}))


def runs_as_is_of_space(space: Space, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`add_runs_as_is` with each row's policy rebuilt from its params."""
    from precsearch.search.sampling import policy_from_params

    return add_runs_as_is(rows, lambda row: policy_from_params(space, row["params"]).to_dict(),
                          space.model_dump(mode="json"))


def recorded_policy(trials: dict[int, FrozenTrial], number: int) -> dict[str, Any] | None:
    """The policy trial ``number`` ran, or its twin's (a duplicate is told its twin's score, not probed)."""
    from precsearch.search.duplicate_trials import DUPLICATE_OF

    seen = set()
    while number in trials and number not in seen:
        attrs = trials[number].user_attrs
        if "policy" in attrs:
            return attrs["policy"]
        seen.add(number)
        number = attrs.get(DUPLICATE_OF, -1)
    return None


def target_line(space: dict[str, Any]) -> str | None:
    """``target: megatron core_v0.16.0 (...)`` for a stored space with a ``target:``, else None."""
    target = space.get("target")
    if not target:
        return None
    fmt = TARGETS.get(target.get("name"))
    version = target.get("version") or (FORMATS[fmt].checked if fmt else "")
    saved = ("" if target.get("name") == "precsearch" else
             f"; mem saved: what {target.get('name')}'s run of the trial saves, predicted by the memory model with "
             "its rules")
    return (f"target: {target.get('name')} {version} (the space offered only choices it runs; 'runs as-is in' "
            f"names the targets that run each trial's combination of them{saved})")


__all__ = ["Choice", "add_runs_as_is", "check_target", "choices", "recorded_policy", "runs_as_is", "runs_as_is_of_space",
           "runs_as_is_of_study", "target_line", "target_problems"]
