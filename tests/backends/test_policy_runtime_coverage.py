"""``apply()`` must not succeed while converting nothing (issue 16, class 9).

A policy whose rule selects blocks the model does not have, selects no block at all, or only
matches layers earlier rules already took, applied "successfully" with 0 layers converted: the
user would train in BF16 believing it FP8. Each case is refused with the rule named.
"""

from __future__ import annotations

import pytest
from torch import nn

from precsearch.backends.emulated import EmulatedBackend
from precsearch.policy import Policy, PolicyError, PolicyRuntime, Rule
from precsearch.precision import Precision
from precsearch.probe.model.llama3 import ModelConfig, build_model

P = Precision
CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
MLP = Rule("mlp", ("*.mlp.*",), P.FP8_CURRENT)


@pytest.mark.parametrize("rules, fragment", [
    ((Rule("deep", ("*",), P.FP8_CURRENT, indices=(5,)),), r"rules\[0\] \('deep'\) names block 5, past"),
    ((MLP, Rule("some_deep", ("*.self_attn.*",), P.FP8_CURRENT, indices=(0, 31))), r"rules\[1\].*block 31"),
    ((Rule("none", ("*",), P.FP8_CURRENT, indices=()),), r"rules\[0\] \('none'\) selects no block"),
    ((Rule("zero", ("*",), P.FP8_CURRENT, first=0),), r"rules\[0\] \('zero'\) selects no block"),
    ((MLP, Rule("late", ("*.mlp.down_proj",), P.FP8_BLOCK)), r"rules\[1\] \('late'\) decides no layer"),
    ((Rule("typo", ("*.feed_forward.*",), P.FP8_CURRENT), MLP), r"rules\[0\] \('typo'\) decides no layer"),
], ids=["indices_past_depth", "one_index_past_depth", "empty_indices", "first_zero", "shadowed", "no_match"])
def test_a_rule_that_converts_nothing_is_refused_by_name(rules, fragment):
    model = build_model(CFG, seed=0)
    with pytest.raises(PolicyError, match=fragment):
        PolicyRuntime(Policy(rules=rules)).apply(model)
    assert EmulatedBackend().converted_layers(model) == {}, "refused, yet converted"


def test_a_model_without_linear_layers_is_refused():
    model = nn.Sequential(nn.Conv1d(4, 4, 1), nn.ReLU())
    with pytest.raises(PolicyError, match="no nn.Linear"):
        PolicyRuntime(Policy(default=P.FP8_CURRENT)).apply(model)
    PolicyRuntime(Policy()).apply(model)  # an all-BF16 policy converts nothing by design: no error


def test_every_rule_deciding_something_still_applies():
    """The refusals above must not catch a policy whose rules all convert something."""
    model = build_model(CFG, seed=0)
    policy = Policy(rules=(Rule("edge", ("*",), P.BF16, last=1), MLP, Rule("attn", ("*.self_attn.*",), P.FP8_BLOCK)))
    PolicyRuntime(policy).apply(model)
    converted = EmulatedBackend().converted_layers(model)
    assert set(converted.values()) == {P.FP8_CURRENT, P.FP8_BLOCK} and len(converted) == 4  # block 0 only
