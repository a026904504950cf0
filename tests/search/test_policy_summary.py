"""A trial's one-line policy (terminal trial lines, the front table, front.csv): every searched param, with a
module searched block by block in many blocks counted per choice instead of listed (SmolLM2's per-module space
has 121 units: listing them made each trial line about 3,000 characters).

What would be wrong if these failed: a per-module study's lines would be unreadable, or a summary would hide a
choice or miscount it, or a small per-module space would lose its per-block detail."""

from __future__ import annotations

from precsearch.search.front import SUMMARISED_BLOCKS, policy_summary


def test_group_params_read_as_they_are_named():
    params = {"precision.attention": "fp8_delayed", "recipe.amax_history_len": 16, "warmup_steps": 10}
    assert policy_summary(params) == "attention=fp8_delayed amax_history_len=16 warmup_steps=10"


def test_a_module_searched_in_many_blocks_is_counted_per_choice_most_first():
    params = {f"precision.L{i}.linear_fc1": "fp8_current" if i % 3 else "bf16" for i in range(30)}
    params |= {f"precision.L{i}.linear_qkv": "fp8_delayed" for i in range(30)}
    params |= {"precision.output_layer": "fp8_current", "clip_grad": 1.0}
    assert policy_summary(params) == ("linear_fc1[30]=fp8_current:20,bf16:10 linear_qkv[30]=fp8_delayed:30 "
                                      "output_layer=fp8_current clip_grad=1.0")


def test_a_module_in_few_blocks_keeps_each_block():
    few = {f"precision.L{i}.linear_fc2": "bf16" for i in range(SUMMARISED_BLOCKS - 1)}
    assert policy_summary(few) == " ".join(f"L{i}.linear_fc2=bf16" for i in range(SUMMARISED_BLOCKS - 1))
