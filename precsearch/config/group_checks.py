"""Checks on ``search.groups`` against the probe's units: every group and pattern must decide some layer.

A group that matches nothing, selects no block or blocks past the probe, or whose every layer an
earlier group already takes (first match wins) is a searched setting that does nothing: the study
would spend trials on it and the exported policy would not say what was measured.
"""

from __future__ import annotations

import fnmatch

from precsearch.arch.config import ModelConfig
from precsearch.arch.units import hf_names, layer_names, unit_names
from precsearch.config.knob import Knob
from precsearch.config.space import Group, Space
from precsearch.errors import UserError
from precsearch.policy.rules import Rule, member_rules
from precsearch.recipes import DEFAULT_PRECISION


def check_groups(space: Space) -> None:
    """Selectors, patterns, shadowing, and fused units split between groups."""
    cfg = space.model.probe()
    names = unit_names(cfg)
    for i, group in enumerate(space.search.groups):
        _check_selector(group, f"search.groups[{i}].layers", cfg.n_layers)
    rules = tuple(g.to_rule(DEFAULT_PRECISION) for g in space.search.groups)
    for i, rule in enumerate(rules):
        _check_matches(rule, f"search.groups[{i}].modules", names, cfg)
    _check_shadowed(rules, names, cfg.n_layers, space.search.default_precision)
    for name in names:
        _check_one_group(name, member_rules(rules, name, cfg.n_layers), rules)


def _check_selector(group: Group, field: str, n_layers: int) -> None:
    sel = group.layers
    if sel is None:
        return
    for key in ("first", "last"):
        value = getattr(sel, key)
        if value is not None and value > n_layers:
            raise UserError(f"{key} {value} exceeds the probe's {n_layers} blocks; valid: 0 to {n_layers}",
                            field=f"{field}.{key}")
    if sel.indices is not None:
        past = [i for i in sel.indices if i >= n_layers]
        if past:
            raise UserError(f"block {past[0]} is past the probe's {n_layers} blocks (0 to {n_layers - 1})",
                            field=f"{field}.indices")
        twice = sorted({i for i in sel.indices if sel.indices.count(i) > 1})
        if twice:
            raise UserError(f"block {twice[0]} is listed twice", field=f"{field}.indices")
    if not (sel.first or sel.last or sel.indices) and (sel.first, sel.last, sel.indices) != (None, None, None):
        raise UserError("selects no block (first and last 0, or no indices); to cover every block leave out "
                        "'layers'", field=field)


def _matches(pattern: str, name: str) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) for n in layer_names(name))


def _check_matches(rule: Rule, field: str, names: list[str], cfg: ModelConfig) -> None:
    if not any(rule.matches(n, cfg.n_layers, alias=a) for n in names for a in hf_names(n)):
        raise UserError(
            f"group '{rule.name}' matches no Linear layer of the {cfg.n_layers}-layer probe; "
            f"layer names look like: {', '.join(names[:3])}, …, {names[-1]} "
            f"(or Hugging Face names such as model.layers.0.self_attn.q_proj)",
            field=field,
        )
    for k, pattern in enumerate(rule.modules):
        if not any(_matches(pattern, n) for n in names):
            raise UserError(f"pattern '{pattern}' matches no Linear layer of the probe (a typo?); names look like "
                            f"{names[0]} or model.layers.0.self_attn.q_proj", field=f"{field}[{k}]")


def _check_shadowed(rules: tuple[Rule, ...], names: list[str], n_layers: int, default: Knob) -> None:
    """A group that decides no layer: every layer it matches goes to an earlier group (first match wins)."""
    deciders: set[str | None] = set()
    takers: dict[str, set[str]] = {r.name: set() for r in rules}
    for name in names:
        for alias in hf_names(name):
            matching = [r for r in rules if r.matches(name, n_layers, alias=alias)]
            deciders.add(matching[0].name if matching else None)
            for later in matching[1:]:
                takers[later.name].add(matching[0].name)
    for i, rule in enumerate(rules):
        if rule.name not in deciders:
            earlier = ", ".join(sorted(takers[rule.name]))
            raise UserError(f"group '{rule.name}' decides no layer: every layer it matches is taken by an earlier "
                            f"group ({earlier}), since the first matching group wins; remove it or move it up",
                            field=f"search.groups[{i}].modules")
    if None not in deciders and not default.is_fixed:
        raise UserError("searched, but every layer is in a group, so no layer runs the default precision: "
                        "the study would spend trials on a setting that changes nothing; give it one value",
                        field="search.default_precision")


def _check_one_group(unit: str, chosen: dict, rules: tuple) -> None:
    """Every Hugging Face name of a fused unit must fall in the same group."""
    groups = {m: r.name if r else "search.default_precision" for m, r in chosen.items()}
    if len(set(groups.values())) > 1:
        first = next(i for i, r in enumerate(rules) if r.name in groups.values())
        listed = ", ".join(f"{m.rsplit('.', 1)[-1]} in {g}" for m, g in groups.items())
        raise UserError(
            f"{unit} is one fused GEMM (Megatron-Core / Transformer Engine), but its projections fall in "
            f"different groups ({listed}); put q/k/v (and gate/up) in one group",
            field=f"search.groups[{first}].modules",
        )
