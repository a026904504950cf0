"""The optimizer states the long paired runs decided against are refused by ``validate``, naming the field, its
value and the soak's figure; those that passed (fp8_block moments with an FP32 master, after the tiny-moment fix)
are accepted.

What would be wrong if these failed: a study could offer per-tensor FP8 moments, which diverge after a few hundred
steps, or BF16 weights without their FP32 master against a baseline that keeps one (+6.4% at length), and its
40-step probes would call them safe.
"""

from __future__ import annotations

import pytest

from _spaces import tiny_space_dict
from precsearch.config.loader import parse_space
from precsearch.config.soak_checks import REFUSED, check_soak
from precsearch.errors import UserError

BF16 = {"probe.param_dtype": "bf16", "search.memory.master_weights": True}


def _check(**overrides) -> None:
    check_soak(parse_space(tiny_space_dict(**overrides)))


@pytest.mark.parametrize("field, value", [
    ("moment_dtype", {"choices": ["bf16", "fp8"]}),
    ("exp_avg_dtype", "fp8"),
    ("exp_avg_sq_dtype", {"choices": ["fp8_block", "fp8"]}),
])
def test_per_tensor_fp8_moments_are_refused_naming_the_field_and_the_soak(field, value):
    with pytest.raises(UserError) as e:
        _check(**BF16, **{f"search.memory.{field}": value})
    message = str(e.value)
    assert f"search.memory.{field}" in message and "'fp8'" in message and "+162%" in message, message
    assert "fp8_block" in message  # what to offer instead


def test_bf16_weights_without_the_baselines_master_are_refused():
    with pytest.raises(UserError) as e:
        _check(**{"probe.param_dtype": "bf16", "search.memory.master_weights": {"choices": [True, False]}})
    message = str(e.value)
    assert "search.memory.master_weights" in message and "False" in message and "+6.4%" in message, message


@pytest.mark.parametrize("overrides", [
    {**BF16, "search.memory.moment_dtype": {"choices": ["bf16", "fp8_block"]}},  # what the 8B space offers
    {**BF16, "search.memory.moment_dtype": "fp8_block", "search.memory.master_dtype": "remainders"},
    {**BF16, "search.memory.moment_dtype": "fp8_block"},  # the FP32 master's NaN, fixed: it soaked clean
    {"probe.param_dtype": "bf16", "objectives.baseline_memory": {"master_weights": False, "moment_dtype": "param"}},
    {},  # FP32 parameters: their own master
])
def test_what_the_soak_passed_is_accepted(overrides):
    _check(**overrides)


def test_every_refusal_states_a_measured_figure_and_what_to_use_instead():
    for rule in REFUSED:
        assert "2026-" in rule.finding and "bench_soak" in rule.finding and rule.advice.startswith("valid:")
