"""policy.yaml carries a per-module policy exactly: written, read back, every unit the same precision."""

from __future__ import annotations

import pytest
import yaml

from _spaces import per_module_policy
from precsearch.export.registry import render
from precsearch.export.format_output import layer_table
from precsearch.policy import Policy


@pytest.mark.parametrize("seed", range(3))
def test_policy_file_round_trips_a_per_module_policy(seed):
    policy = per_module_policy(5, seed, ("bf16", "fp8_current", "fp8_delayed", "fp8_block"))
    text = render("policy", policy, 5, {"trial": 3}).files
    (content,) = text.values()
    loaded = yaml.safe_load(content)
    back = Policy.from_dict(loaded.get("policy", loaded))
    assert back == policy
    assert layer_table(back, 5) == layer_table(policy, 5)
    assert len({p for p in layer_table(policy, 5).values()}) > 1  # the units really differ
