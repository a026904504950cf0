"""The policy file (``policy.yaml``): schema-versioned, human-readable, with provenance.

Layout::

    schema_version: 1
    policy:        # what Policy.to_dict() writes: default, rules, recipe, warmup_steps, clip_grad
      ...
    provenance:    # where it came from: study, trial, objectives, probe, versions
      ...
"""

from __future__ import annotations

from dataclasses import fields
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from precsearch.errors import UserError
from precsearch.policy.rules import FP8_ATTENTION, MASTER_DTYPES, MOMENT_DTYPES, MemoryKnobs, Policy
from precsearch.precision import MAX_AMAX_HISTORY, MAX_MARGIN, AmaxAlgo, Fp8Format, LayerRecipe, Precision

SCHEMA_VERSION = 1


def dump_policy(policy: Policy, provenance: dict[str, Any] | None = None) -> str:
    """The YAML text of a policy file."""
    data = {"schema_version": SCHEMA_VERSION, "policy": policy.to_dict(), "provenance": provenance or {}}
    return yaml.safe_dump(data, sort_keys=False)


def save_policy(policy: Policy, path: Path, provenance: dict[str, Any] | None = None) -> None:
    """Write a policy file."""
    Path(path).write_text(dump_policy(policy, provenance))


def load_policy_file(path: Path) -> tuple[Policy, dict[str, Any]]:
    """Read a policy file; a newer schema or a malformed file is refused with a clear message.

    Raises:
        UserError: naming the file and the field (``policy.rules[2].precision``) that is wrong.
    """
    from precsearch.config.loader import load_yaml

    path = Path(path)
    return parse_policy(load_yaml(path), file=str(path))


def parse_policy(data: Any, *, file: str = "<policy>") -> tuple[Policy, dict[str, Any]]:
    """A policy file's data (as YAML gives it) -> the policy and its provenance.

    Raises:
        UserError: naming ``file`` and the field that is wrong; nothing else, whatever ``data`` is.
    """
    from precsearch.config.loader import check_plain_data

    if not isinstance(data, dict) or "policy" not in data:
        raise UserError("not a precsearch policy file (no 'policy' section)", file=file)
    check_plain_data(data, file=file)
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise UserError(f"schema_version {_shown(version)} is not supported; this precsearch reads "
                        f"1..{SCHEMA_VERSION}", file=file, field="schema_version")
    try:
        _check_keys(data, "", _TOP_KEYS)
        _check_policy(data["policy"])
        provenance = data.get("provenance") or {}
        _expect(isinstance(provenance, dict), "provenance", "a mapping", provenance)
        return Policy.from_dict(data["policy"]), provenance
    except UserError as exc:
        raise exc.located(file=file) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"malformed policy: {exc}", file=file, field="policy") from None


_TOP_KEYS = ("schema_version", "policy", "provenance")
_POLICY_KEYS = ("default", "rules", "recipe", "warmup_steps", "clip_grad", "memory")
_RULE_KEYS = ("name", "modules", "precision", "layers")
_LAYER_KEYS = ("first", "last", "indices")
_RECIPE_KEYS = tuple(f.name for f in fields(LayerRecipe) if f.name != "precision")
_MEMORY_KEYS = tuple(f.name for f in fields(MemoryKnobs))


def _check_policy(policy: Any) -> None:
    """The ``policy`` section's shape and value types, field by field (values' meaning is the dataclasses')."""
    _check_keys(policy, "policy", _POLICY_KEYS)
    if "default" in policy:
        _check_name(policy["default"], "policy.default", Precision)
    rules = policy.get("rules", [])
    _expect(isinstance(rules, list), "policy.rules", "a list of rules", rules)
    for i, rule in enumerate(rules):
        _check_rule(rule, f"policy.rules[{i}]")
    recipe = policy.get("recipe", {})
    _check_keys(recipe, "policy.recipe", _RECIPE_KEYS)
    for key, low, high in (("amax_history_len", 1, MAX_AMAX_HISTORY), ("margin", 0, MAX_MARGIN)):
        if key in recipe:
            _check_count(recipe[key], f"policy.recipe.{key}", minimum=low, maximum=high)
    for key, names in (("fp8_format", Fp8Format), ("amax_compute_algo", AmaxAlgo)):
        if key in recipe:
            _check_name(recipe[key], f"policy.recipe.{key}", names)
    _check_count(policy.get("warmup_steps", 0), "policy.warmup_steps", minimum=0)
    clip = policy.get("clip_grad")
    _expect(clip is None or (_is_number(clip) and clip > 0), "policy.clip_grad", "null or a number > 0", clip)
    memory = policy.get("memory", {})
    _check_keys(memory, "policy.memory", _MEMORY_KEYS)
    for key in ("master_weights", "fp8_weights"):
        if key in memory:
            _expect(isinstance(memory[key], bool), f"policy.memory.{key}", "true or false", memory[key])
    for key, valid in (("moment_dtype", MOMENT_DTYPES), ("exp_avg_dtype", (None, *MOMENT_DTYPES)),
                       ("exp_avg_sq_dtype", (None, *MOMENT_DTYPES)), ("master_dtype", MASTER_DTYPES),
                       ("fp8_attention", FP8_ATTENTION)):
        if key in memory:
            _expect(memory[key] in valid, f"policy.memory.{key}",
                    f"one of {', '.join('null' if v is None else v for v in valid)}", memory[key])
    if memory.get("fp8_weights") and memory.get("master_dtype", "fp32") != "fp32":
        raise UserError(f"master_dtype {memory['master_dtype']!r} cannot go with fp8_weights: TE's FP8-parameter "
                        "Adam kernel keeps FP32 master weights; valid: fp32, or fp8_weights false",
                        field="policy.memory.master_dtype")


def _check_rule(rule: Any, field: str) -> None:
    _check_keys(rule, field, _RULE_KEYS)
    for key in ("name", "modules", "precision"):
        if key not in rule:
            raise UserError("malformed policy: this field is required", field=f"{field}.{key}")
    _expect(isinstance(rule["name"], str), f"{field}.name", "a string", rule["name"])
    modules = rule["modules"]
    _expect(isinstance(modules, list) and bool(modules) and all(isinstance(m, str) for m in modules),
            f"{field}.modules", "a non-empty list of name patterns", modules)
    _check_name(rule["precision"], f"{field}.precision", Precision)
    layers = rule.get("layers") or {}
    _check_keys(layers, f"{field}.layers", _LAYER_KEYS)
    for key in ("first", "last"):
        if layers.get(key) is not None:
            _check_count(layers[key], f"{field}.layers.{key}", minimum=0)
    indices = layers.get("indices")
    _expect(indices is None or (isinstance(indices, list) and bool(indices)
                                and all(_is_int(i) and i >= 0 for i in indices)),
            f"{field}.layers.indices", "a non-empty list of block numbers >= 0 (an empty one selects no block)",
            indices)


def _check_keys(value: Any, field: str, allowed: tuple[str, ...]) -> None:
    _expect(isinstance(value, dict), field or "(top level)", "a mapping", value)
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise UserError(f"malformed policy: unknown key {unknown[0]!r}; valid keys: {', '.join(allowed)}",
                        field=field or None)


def _check_name(value: Any, field: str, names: type[Enum]) -> None:
    valid = [n.value for n in names]
    _expect(isinstance(value, str) and value in valid, field, f"one of {', '.join(valid)}", value)


def _check_count(value: Any, field: str, *, minimum: int, maximum: int | None = None) -> None:
    if maximum is None:
        _expect(_is_int(value) and value >= minimum, field, f"a whole number >= {minimum}", value)
    else:
        _expect(_is_int(value) and minimum <= value <= maximum, field, f"a whole number from {minimum} to {maximum}",
                value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _expect(ok: bool, field: str, what: str, value: Any) -> None:
    if not ok:
        raise UserError(f"malformed policy: expected {what}, got {_shown(value)}", field=field)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
