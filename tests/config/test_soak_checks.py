"""``validate`` offers only what the long paired runs passed: the states and recipes they decided against are
refused, naming the field, its value and the soak's figure; states and GEMM recipes no row has passed are refused
the same way unless the space sets ``search.allow_unsoaked``, and then each is warned about once; the passed ones
are accepted.

What would be wrong if these failed: a study could offer per-tensor FP8 moments, which diverge after a few hundred
steps, BF16 weights without their FP32 master against a baseline that keeps one (+6.4% at length), NVFP4 GEMMs
(one emulated seed of 8 +22% at length), or a state or recipe nobody ran past 40 steps, and its probes would call
them safe; or a space that passed would be refused.
"""

from __future__ import annotations

import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.config.soak_checks import REFUSED, check_soak, soak_warnings
from precsearch.errors import UserError, UserErrors

BF16 = {"probe.param_dtype": "bf16", "search.memory.master_weights": True}
REMAINDERS = {**BF16, "search.memory.master_dtype": "remainders"}
FP16_MASTER = {**BF16, "search.memory.master_dtype": "fp16"}
NVFP4 = {"search.groups": [{"name": "mlp", "modules": ["*.mlp.*"], "precision": {"choices": ["bf16", "nvfp4"]}}]}


def _check(**overrides) -> None:
    check_soak(parse_space(tiny_space_dict(**overrides)))


def _refusal(**overrides) -> str:
    with pytest.raises(UserError) as e:
        _check(**overrides)
    return str(e.value)


@pytest.mark.parametrize("field, value", [
    ("moment_dtype", {"choices": ["bf16", "fp8"]}),
    ("exp_avg_dtype", "fp8"),
    ("exp_avg_sq_dtype", {"choices": ["fp8_block", "fp8"]}),
])
def test_per_tensor_fp8_moments_are_refused_naming_the_field_and_the_soak(field, value):
    message = _refusal(**REMAINDERS, **{f"search.memory.{field}": value})
    assert f"search.memory.{field}: 'fp8'" in message and "+162%" in message, message
    assert "fp8_block" in message  # what to offer instead


def test_bf16_weights_without_the_baselines_master_are_refused():
    message = _refusal(**{"probe.param_dtype": "bf16", "search.memory.master_weights": {"choices": [True, False]},
                          "search.memory.master_dtype": "remainders"})
    assert "search.memory.master_weights: False" in message and "+6.4%" in message, message


@pytest.mark.parametrize("overrides", [
    {**REMAINDERS, "search.memory.moment_dtype": {"choices": ["bf16", "fp8_block"]}},  # what the 8B space offers
    {**BF16, "search.memory.moment_dtype": "fp8_block"},  # the FP32 master's NaN, fixed: it soaked clean
    {**BF16, "search.memory.exp_avg_dtype": "fp8_block", "search.memory.exp_avg_sq_dtype": "fp8_block"},  # the same
    {**BF16, "search.memory.moment_dtype": "fp32"},  # the standard set-up
    {"probe.param_dtype": "bf16", "objectives.baseline_memory": {"master_weights": False, "moment_dtype": "param"}},
    {},  # FP32 parameters: their own master, FP32 moments
    {"search.groups": [{"name": "all", "modules": ["*"], "precision": {"choices": ["fp8_delayed", "fp8_current",
                                                                                    "fp8_block"]}}]},
    # their emulated rows ran 8 seeds on an H100 (2026-12-07)
    {"search.groups": [{"name": "all", "modules": ["*"], "precision": {"choices": ["mxfp8", "fp8_rowwise"]}}]},
])
def test_what_the_soak_passed_is_accepted(overrides):
    space = parse_space(tiny_space_dict(**overrides))
    check_soak(space)
    assert soak_warnings(space) == []


@pytest.mark.parametrize("overrides, named, row", [
    # an FP16 master with BF16 moments: each half passed beside the other kind (std_fp16_fp32, std_fp32_bf16)
    ({**FP16_MASTER, "search.memory.moment_dtype": "bf16"}, "search.memory.master_dtype: 'fp16'",
     "no bench_soak row runs it"),
    # the searched field is named, not the one fixed beside it
    ({**FP16_MASTER, "search.memory.moment_dtype": {"choices": ["fp32", "bf16"]}},
     "search.memory.moment_dtype: 'bf16'", "no bench_soak row runs it"),
    ({**REMAINDERS, "search.memory.moment_dtype": "fp8_block", "search.memory.exp_avg_dtype": "bf16"},
     "search.memory.exp_avg_dtype: 'bf16'", "no bench_soak row runs it"),  # a mixed pair is a state of its own
    ({"search.memory.exp_avg_dtype": "bf16"}, "search.memory.exp_avg_dtype: 'bf16'",
     "no bench_soak row runs it"),  # FP32 params, their own master: BF16 first moment, FP32 second
])
def test_an_unsoaked_choice_is_refused_naming_the_field_its_value_and_what_passed(overrides, named, row):
    message = _refusal(**overrides)
    assert named in message and row in message and "no long run has passed" in message, message
    assert "passed nearby:" in message and "2026-12-06" in message and "search.allow_unsoaked: true" in message


def test_a_recipe_no_row_ran_is_refused_naming_the_field_and_the_recipes_that_passed(unsoaked_nvfp4):
    message = _refusal(**NVFP4)
    assert "search.groups[0].precision: 'nvfp4' offers NVFP4 GEMMs" in message, message
    assert "no bench_soak row runs it" in message and "search.allow_unsoaked: true" in message, message
    assert "mxfp8 (row mxfp8_emulated: -0.47% ± 0.91%" in message, message  # a passed recipe, with its figure


@pytest.mark.parametrize("allow_unsoaked", [False, True])
def test_a_recipe_whose_long_run_diverged_is_refused_opt_in_or_not(allow_unsoaked):
    """NVFP4's emulated row (H100, 2026-12-07): seed 7 +22.2% (diverged, over 20%), seed 6 +16.8%."""
    message = _refusal(**NVFP4, **{"search.allow_unsoaked": allow_unsoaked})
    assert "search.groups[0].precision: 'nvfp4' offers NVFP4 GEMMs" in message, message
    assert "which the long runs refused" in message and "+22.2%" in message and "2026-12-07" in message, message
    assert "valid: a recipe that passed (" in message and "mxfp8" in message, message  # what to use instead
    assert "allow_unsoaked" not in message  # no opt-in offers it


def test_the_nearest_passed_states_are_the_ones_named():
    """FP16 master + BF16 moments is one part from three passed states; each is named with its row."""
    message = _refusal(**FP16_MASTER, **{"search.memory.moment_dtype": "bf16"})
    for row in ("std_fp32_bf16", "std_rem_bf16", "std_fp16_fp32"):
        assert f"row {row}:" in message, message
    assert "std_rem_fp8block" not in message  # two parts away


def test_fp8_only_weights_pass_in_the_state_their_row_ran_and_nowhere_else():
    """Refused while their row diverged (+39.9%, a stale FP8 transpose); passed once it ran with the fix (-1.36%,
    H100, 2026-12-07). The row ran TE's FP8-parameter kernel (FP32 master and moments): with BF16 moments asked,
    that kernel still keeps FP32 ones, the same state; nothing else with FP8 weights has run."""
    _check(**BF16, **{"search.memory.fp8_weights": {"choices": [False, True]}})
    message = _refusal(**BF16, **{"search.memory.fp8_weights": {"choices": [False, True]},
                                  "search.memory.moment_dtype": "fp8_block"})
    assert "fp8_weights" in message and "row std_fp32_fp32_fp8w:" in message, message


def test_every_problem_is_reported_at_once():
    with pytest.raises(UserErrors) as e:
        _check(**{**REMAINDERS, "search.memory.master_weights": {"choices": [True, False]}}, **NVFP4,
               **{"search.memory.moment_dtype": {"choices": ["bf16", "fp8"]}})
    fields = [p.field for p in e.value.problems]
    assert fields == ["search.memory.moment_dtype", "search.memory.master_weights", "search.groups[0].precision"], \
        fields
    assert str(e.value).count("\n") == 2  # one line each


def test_the_opt_in_accepts_an_unsoaked_choice_and_warns_once_for_each(unsoaked_nvfp4):
    space = parse_space(tiny_space_dict(**FP16_MASTER, **NVFP4, **{
        "search.memory.moment_dtype": {"choices": ["fp32", "bf16"]}, "search.allow_unsoaked": True}))
    check_soak(space)
    warnings = soak_warnings(space)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("search.memory.moment_dtype: 'bf16' offers master fp16, moments bf16/bf16")
    assert warnings[1].startswith("search.groups[0].precision: 'nvfp4' offers NVFP4 GEMMs")
    assert all("search.allow_unsoaked is true" in w for w in warnings)


def test_the_opt_in_does_not_offer_what_the_soak_refused():
    message = _refusal(**REMAINDERS, **{"search.memory.moment_dtype": "fp8", "search.allow_unsoaked": True})
    assert "search.memory.moment_dtype: 'fp8'" in message and "+162%" in message, message


def test_validate_prints_one_warning_line_per_unsoaked_choice(tmp_path, capsys, unsoaked_nvfp4):
    path = write_space(tmp_path, tiny_space_dict(**NVFP4, **{"search.allow_unsoaked": True}))
    assert main(["validate", str(path)]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert lines == [line for line in lines if "search.groups[0].precision: 'nvfp4'" in line] and len(lines) == 1, err


def test_validate_refuses_without_the_opt_in(tmp_path, capsys, unsoaked_nvfp4):
    path = write_space(tmp_path, tiny_space_dict(**NVFP4))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: search.groups[0].precision: 'nvfp4'" in err and "search.allow_unsoaked" in err, err


def test_validate_refuses_what_the_soak_refused_with_its_figure(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(**NVFP4, **{"search.allow_unsoaked": True}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: search.groups[0].precision: 'nvfp4'" in err and "diverged" in err, err


def test_every_refusal_states_a_measured_figure_and_what_to_use_instead():
    for rule in REFUSED:
        assert "2026-" in rule.finding and "bench_soak" in rule.finding and rule.advice.startswith("valid:")
