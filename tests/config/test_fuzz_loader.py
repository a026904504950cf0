"""Fuzzing the space and policy loaders: whatever the input, a :class:`UserError` or a result, nothing else.

Any other exception reaching the CLI is a traceback shown to a user, so each test feeds random
input and fails on the first exception that is not a ``UserError`` (hypothesis then shrinks it to a
minimal example). A failure names an input the loaders do not yet turn into a clear message.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _spaces import tiny_space_dict
from precsearch.config.loader import load_space, parse_space
from precsearch.errors import UserError
from precsearch.policy.file import load_policy_file, parse_policy

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])

_WORDS = ["model", "probe", "search", "study", "data", "objectives", "tracking", "backend", "groups", "name",
          "modules", "precision", "layers", "first", "choices", "low", "high", "step", "log", "policy", "rules",
          "schema_version", "recipe", "warmup_steps", "clip_grad", "memory", "bf16", "fp8_current", "tiny"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6), st.sampled_from(_WORDS))
trees = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(_WORDS), st.text(max_size=4), st.integers(), st.none()), inner,
                    max_size=4)), max_leaves=20)
bounds = st.one_of(st.integers(0, 10), st.floats(0, 10), scalars)  # often valid, so the checks after them run
# knob-shaped values: the space's searchable settings parse these three ways
knobs = st.one_of(
    st.fixed_dictionaries({"low": bounds, "high": bounds}, optional={"step": st.one_of(bounds, trees), "log": trees}),
    st.fixed_dictionaries({"choices": st.one_of(st.lists(trees, max_size=4), trees)}),
    st.dictionaries(st.sampled_from(["choices", "low", "high", "step", "log", "x"]), trees, max_size=4),
)
values = st.one_of(trees, knobs)

_YAML_BITS = ["\n", "  ", "\t", ": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "<<: ", "!!python/object ", "!x ",
              "? ", "|", ">", "'", '"', "#", "~", ".nan", ".inf", "1e999", "0x1F", "---", "...", "%YAML 1.1\n",
              "\x00", "\ufeff", "\u2028", "9" * 30, "9" * 5000, "2020-13-45", "2020-01-01", "12:30:00", "!!int ",
              "!!bool ", "!!float ", "!!timestamp ", "!!set ", "!!omap ", "!!binary ", "!!str ", "!!map ", "!!seq "]
yaml_text = st.lists(st.one_of(st.sampled_from(_YAML_BITS), st.sampled_from(_WORDS), st.text(max_size=5)),
                     max_size=40).map("".join)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into ``node`` (mappings and lists), parents included."""
    out = [prefix] if prefix else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        out += _paths(child, prefix + (key,))
    return out


def _mutated(base: dict, edits: list[tuple[tuple, Any, bool]]) -> dict:
    """``base`` with each (path, value, delete) edit applied where the path still exists."""
    data = copy.deepcopy(base)
    for path, value, delete in edits:
        node = data
        for key in path[:-1]:
            node = node[key] if isinstance(node, (dict, list)) and _has(node, key) else None
        if isinstance(node, dict) and delete:
            node.pop(path[-1], None)
        elif isinstance(node, (dict, list)) and _has(node, path[-1]):
            node[path[-1]] = value
    return data


def _has(node: dict | list, key: Any) -> bool:
    return key in node if isinstance(node, dict) else isinstance(key, int) and key < len(node)


def _only_user_errors(call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except UserError as exc:
        lines = str(exc).split("\n")  # not splitlines(): a key may hold \x1c-\x1e, which it splits at
        label = lines[0].split(":", 1)[0]  # the file, as every problem's line names it
        assert all(line.strip().startswith(f"{label}:") for line in lines), (
            f"a user error is one line per problem, each naming the file: {str(exc)!r}")


SPACE = tiny_space_dict()
SPACE["search"]["memory"] = {"master_weights": False, "moment_dtype": "param", "fp8_weights": False}
SPACE["search"]["recipe"] = {"fp8_format": "hybrid", "amax_history_len": 16, "amax_compute_algo": "max", "margin": 0}
SPACE_PATHS = _paths(SPACE)
POLICY = {
    "schema_version": 1,
    "policy": {"default": "bf16",
               "rules": [{"name": "a", "modules": ["*.mlp.*"], "precision": "fp8_current",
                          "layers": {"first": 1, "last": 1, "indices": [2]}}],
               "recipe": {"fp8_format": "hybrid", "amax_history_len": 16, "amax_compute_algo": "max", "margin": 0},
               "warmup_steps": 3, "clip_grad": 1.0,
               "memory": {"master_weights": False, "moment_dtype": "param", "fp8_weights": False}},
    "provenance": {"trial": 1},
}
edits = st.lists(st.tuples(st.sampled_from(SPACE_PATHS), values, st.booleans()), min_size=1, max_size=3)
policy_edits = st.lists(st.tuples(st.sampled_from(_paths(POLICY)), values, st.booleans()), min_size=1, max_size=3)


def test_the_unmutated_bases_are_valid():
    """Otherwise every mutation below would fail for the same dull reason and explore nothing."""
    parse_space(SPACE)
    parse_policy(POLICY)


@FUZZ
@given(edits)
def test_mutated_space_data(changes):
    _only_user_errors(parse_space, _mutated(SPACE, changes))


KNOB_PATHS = [("search", k) for k in ("default_precision", "warmup_steps", "clip_grad")] + \
    [("search", "recipe", k) for k in ("fp8_format", "amax_history_len", "amax_compute_algo", "margin")] + \
    [("search", "memory", k) for k in ("master_weights", "moment_dtype", "fp8_weights")] + \
    [("search", "groups", 0, "precision"), ("search", "groups", 1, "precision")]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(KNOB_PATHS), knobs, st.just(False)), min_size=1, max_size=2))
def test_searchable_settings_with_knob_shaped_values(changes):
    """Ranges and choices with wrong types (a word as a step, lists as bounds) are where parsers compare."""
    _only_user_errors(parse_space, _mutated(SPACE, changes))


NUMERIC_KNOBS = [("search", "warmup_steps"), ("search", "clip_grad"), ("search", "recipe", "amax_history_len"),
                 ("search", "recipe", "margin")]


@FUZZ
@given(st.sampled_from(NUMERIC_KNOBS), st.integers(0, 10), st.integers(0, 10), trees, trees)
def test_numeric_ranges_with_any_step_and_log(path, low, high, step, log):
    """Valid bounds, so parsing goes on to ``step`` and ``log``, which are compared and tested for truth."""
    _only_user_errors(parse_space, _mutated(SPACE, [(path, {"low": low, "high": high, "step": step, "log": log},
                                                     False)]))


@FUZZ
@given(trees)
def test_arbitrary_data_as_a_space(data):
    _only_user_errors(parse_space, data)


@FUZZ
@given(policy_edits)
def test_mutated_policy_data(changes):
    _only_user_errors(parse_policy, _mutated(POLICY, changes))


@FUZZ
@given(trees)
def test_arbitrary_data_as_a_policy(data):
    _only_user_errors(parse_policy, data)
    _only_user_errors(parse_policy, {"schema_version": 1, "policy": data})


@FUZZ
@given(yaml_text)
def test_yaml_ish_text_as_a_space_or_policy_file(tmp_path: Path, text: str):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _only_user_errors(load_space, path)
    _only_user_errors(load_policy_file, path)
