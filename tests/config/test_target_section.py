"""A space's ``target:`` (issue 52, item 1): the search offers only what the target can run.

Each test states the refusal it would miss: a target's space must refuse every choice its framework runs
otherwise (all of them at once, each naming the field, the value and the target), accept what it runs, and a
space without ``target:`` must behave as before.
"""

from __future__ import annotations

import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.errors import UserError, UserErrors
from precsearch.runtime.target_space import check_target

CURRENT_ONLY = [{"name": "attention", "modules": ["*.self_attention.*"],
                 "precision": {"choices": ["bf16", "fp8_current"]}},
                {"name": "mlp", "modules": ["*.mlp.*"], "precision": {"choices": ["bf16", "fp8_current"]}}]


def _lines(target: dict, **overrides) -> list[str]:
    """The refusal's lines for the smoke space with ``target`` and ``overrides`` (none: [])."""
    space = parse_space(tiny_space_dict(target=target, **overrides))
    try:
        check_target(space, file="space.yaml")
    except UserErrors as exc:
        return [str(p) for p in exc.problems]
    except UserError as exc:  # pragma: no cover - check_target always lists its problems
        return [str(exc)]
    return []


def test_a_misspelt_target_names_the_closest():
    with pytest.raises(UserError) as caught:
        parse_space(tiny_space_dict(target={"name": "megatorn"}))
    assert "target.name" in str(caught.value) and "did you mean 'megatron'?" in str(caught.value)


def test_a_target_needs_a_name():
    with pytest.raises(UserError, match="target.name"):
        parse_space(tiny_space_dict(target={"version": "0.2.2"}))


def test_without_a_target_every_choice_is_offered():
    space = parse_space(tiny_space_dict(**{"search.memory": {"fp8_attention": {"choices": ["off", "dpa"]}}}))
    assert space.target is None
    check_target(space, file="space.yaml")  # nothing refused


def test_precsearch_runs_everything_the_tool_searches():
    assert _lines({"name": "precsearch"}, **{
        "search.memory": {"moment_dtype": {"choices": ["param", "fp8_block"]}, "fp8_attention": "dpa"},
        "search.recipe": {"fp8_format": {"choices": ["hybrid", "e4m3"]}}}) == []


def test_torchtitan_refuses_every_choice_it_cannot_run_at_once():
    lines = _lines({"name": "torchtitan"}, **{
        "probe.param_dtype": "bf16",  # master weights of FP32 parameters would be the parameters (nothing to refuse)
        "search.recipe": {"fp8_format": {"choices": ["hybrid", "e4m3"]}},
        "search.memory": {"master_weights": {"choices": [False, True]}, "fp8_attention": {"choices": ["off", "mha"]}}})
    expected = {  # field -> value: the smoke space's delayed attention, block MLP and warm-up, then the additions
        "search.groups[0].precision": "fp8_delayed for group attention",
        "search.groups[1].precision": "fp8_block for group mlp",
        "search.recipe.fp8_format": "e4m3",
        "search.warmup_steps": "offers 4,",
        "search.memory.master_weights": "true",
        "search.memory.fp8_attention": "mha",
    }
    assert len(lines) == len(expected), lines
    for field, value in expected.items():
        line = next((l for l in lines if l.startswith(f"space.yaml: {field}: ")), None)
        assert line is not None, (field, lines)
        assert value in line and "target torchtitan (0.2.2)" in line and "valid:" in line, line
    assert not any("fp8_current" in l.split(" which ")[0] for l in lines)  # tensorwise is torchtitan's


def test_megatron_refuses_what_fp8stateadamw_needs_and_its_missing_flags():
    lines = _lines({"name": "megatron"}, **{
        "search.groups": CURRENT_ONLY,
        "search.memory": {"master_weights": True, "moment_dtype": {"choices": ["bf16", "fp8_block"]},
                          "fp8_attention": {"choices": ["off", "dpa"]}}})
    fields = [l.split(": ")[1] for l in lines]
    assert fields == ["search.warmup_steps", "search.memory.moment_dtype", "search.memory.fp8_attention"], lines
    assert "offers fp8_block" in lines[1] and "first moment: fp8_block -> bf16" in lines[1]
    assert "no block-scaled FP8 optimizer state" in lines[1]  # the export's own words say why
    assert "fp8_attention: dpa -> off" in lines[2]


def test_megatron_accepts_what_it_runs():
    """Per-module tensorwise FP8, clipping choices, BF16 moments beside FP32 main parameters, FP8 weights."""
    assert _lines({"name": "megatron", "version": "core_v0.17.0"}, **{
        "search.groups": CURRENT_ONLY, "search.warmup_steps": 0, "search.clip_grad": {"choices": [None, 1.0]},
        "search.memory": {"master_weights": True, "moment_dtype": {"choices": ["fp32", "bf16"]},
                          "fp8_weights": {"choices": [False, True]}}}) == []


def test_accelerate_accepts_the_smoke_space():
    """Its snippet falls back to precsearch's Python API for what Accelerate has no setting for."""
    assert _lines({"name": "accelerate"}) == []


def test_a_version_the_export_does_not_run_on_is_refused():
    lines = _lines({"name": "torchtitan", "version": "0.3.1"}, **{"search.groups": CURRENT_ONLY,
                                                                   "search.warmup_steps": 0})
    assert lines == ["space.yaml: target.version: precsearch's torchtitan export runs on torchtitan 0.2 or newer, "
                     "before 0.3 (checked against 0.2.2); got 0.3.1; valid: a version in that span, or leave "
                     "version out"]


def test_validate_lists_every_refusal(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(target={"name": "torchtitan"}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "search.groups[0].precision" in err and "search.warmup_steps" in err


def test_validate_names_the_target_of_a_valid_space(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(target={"name": "accelerate"}))
    assert main(["validate", str(path)]) == 0
    assert "target: accelerate 1.16 " in capsys.readouterr().out
