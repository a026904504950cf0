"""MemoryKnobs: the optimizer-state and attention knobs as data, and their checks in policy files.

What would be wrong if these failed: a policy file with an FP8 moment or an FP16 master would not
round-trip (an export would lose the knob), a misspelt value would reach TE as a stack trace, or the
standard baseline would not resolve to plain AdamW for FP32 parameters (the CPU quickstart would
refuse to run its reference).
"""

from __future__ import annotations

import pytest
import yaml

from precsearch.errors import UserError
from precsearch.policy import MemoryKnobs, Policy
from precsearch.policy.file import dump_policy, load_policy_file


def test_each_moment_can_be_set_apart():
    k = MemoryKnobs(master_weights=True, moment_dtype="bf16", exp_avg_dtype="fp8")
    assert k.moment_dtypes("bf16") == ("fp8", "bf16")
    assert k.moments("bf16") == "mixed"
    assert MemoryKnobs(moment_dtype="param").moment_dtypes("bf16") == ("bf16", "bf16")


def test_master_dtype_only_counts_with_master_weights_and_is_fp32_under_fp8_weights():
    assert MemoryKnobs(master_dtype="fp16").master == "none"
    assert MemoryKnobs(master_weights=True, master_dtype="remainders").master == "remainders"
    assert MemoryKnobs(fp8_weights=True, master_dtype="fp16").master == "fp32"  # TE's FP8-parameter kernel


def test_fp8_weights_keep_fp8_moments_but_not_bf16_ones():
    assert MemoryKnobs(fp8_weights=True, moment_dtype="fp8").moment_dtypes("bf16") == ("fp8", "fp8")
    assert MemoryKnobs(fp8_weights=True, moment_dtype="bf16").moment_dtypes("bf16") == ("fp32", "fp32")


@pytest.mark.parametrize("field, value", [("moment_dtype", "fp4"), ("exp_avg_dtype", "int8"),
                                          ("master_dtype", "bf16"), ("fp8_attention", "yes")])
def test_unknown_values_name_the_field_and_the_valid_ones(field, value):
    with pytest.raises(ValueError, match=field) as err:
        MemoryKnobs(**{field: value})
    assert "valid" in str(err.value)


def test_standard_baseline_resolves_to_plain_adamw_for_fp32_parameters():
    standard = MemoryKnobs(master_weights=True, moment_dtype="fp32")
    assert standard.resolved("fp32").is_default
    assert standard.resolved("bf16") == standard
    assert not MemoryKnobs(master_weights=True, moment_dtype="fp8").resolved("fp32").is_default


def test_changed_lists_the_knobs_that_differ_from_the_default():
    assert MemoryKnobs().changed() == []
    assert MemoryKnobs(fp8_attention="dpa", exp_avg_sq_dtype="fp8").changed() == ["exp_avg_sq_dtype=fp8",
                                                                               "fp8_attention=dpa"]


def test_every_knob_round_trips_through_a_policy_file(tmp_path):
    memory = MemoryKnobs(master_weights=True, moment_dtype="bf16", exp_avg_dtype="fp8", master_dtype="remainders",
                         fp8_attention="dpa")
    path = tmp_path / "policy.yaml"
    path.write_text(dump_policy(Policy(memory=memory), {}))
    assert load_policy_file(path)[0].memory == memory


@pytest.mark.parametrize("memory, field", [
    ({"moment_dtype": "fp4"}, "policy.memory.moment_dtype"),
    ({"exp_avg_sq_dtype": "int8"}, "policy.memory.exp_avg_sq_dtype"),
    ({"fp8_attention": "all"}, "policy.memory.fp8_attention"),
    ({"master_dtype": "bf16"}, "policy.memory.master_dtype"),
])
def test_a_bad_memory_knob_in_a_policy_file_names_the_field(tmp_path, memory, field):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "policy": {"memory": memory}}))
    with pytest.raises(UserError, match=field.replace(".", r"\.")):
        load_policy_file(path)
