"""Precision units: Megatron-Core's module names, with Hugging Face names as aliases.

If these fail, a policy found on the probe would name other modules than the training stack runs,
or a Hugging Face name would silently land on the wrong unit.
"""

from __future__ import annotations

import pytest
from torch import nn

from precsearch.arch import PRESETS
from precsearch.arch.units import hf_names, is_normed, unit_kind, unit_names, unit_of, unit_shape
from precsearch.policy.rules import Policy, PrecisionConflict, Rule
from precsearch.precision import Precision as P
from precsearch.probe.model.llama3 import build_model

CFG = PRESETS["tiny"]


def test_units_are_the_probes_gemm_modules_in_execution_order():
    model = build_model(CFG, 0)
    assert unit_names(CFG) == [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name in unit_names(CFG):
        fan_in, fan_out = unit_shape(CFG, name)
        assert model.get_submodule(name).weight.shape == (fan_out, fan_in), name
        assert is_normed(name) == hasattr(model.get_submodule(name), "layer_norm_weight"), name


@pytest.mark.parametrize(("name", "unit"), [
    ("model.layers.3.self_attn.q_proj", "decoder.layers.3.self_attention.linear_qkv"),
    ("model.layers.3.self_attn.v_proj", "decoder.layers.3.self_attention.linear_qkv"),
    ("model.layers.0.self_attn.o_proj", "decoder.layers.0.self_attention.linear_proj"),
    ("model.layers.12.mlp.up_proj", "decoder.layers.12.mlp.linear_fc1"),
    ("model.layers.1.mlp.down_proj", "decoder.layers.1.mlp.linear_fc2"),
    ("lm_head", "output_layer"),
    ("decoder.layers.2.mlp.linear_fc2", "decoder.layers.2.mlp.linear_fc2"),
    ("model.layers.1.input_layernorm", None),
    ("decoder.layers.1.self_attention.core_attention", None),
])
def test_unit_of_maps_both_namings(name, unit):
    assert unit_of(name) == unit


def test_hf_names_round_trip_and_refuse_non_units():
    for unit in unit_names(CFG):
        assert all(unit_of(hf) == unit for hf in hf_names(unit))
    assert hf_names("decoder.layers.0.mlp.linear_fc1") == ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")
    assert unit_kind("output_layer") == "output_layer"
    with pytest.raises(ValueError, match="not a precision unit"):
        hf_names("model.layers.0.mlp.gate_proj")


def test_policy_resolves_a_unit_from_either_naming_and_refuses_a_split():
    by_hf = Policy(rules=(Rule("mlp", ("*.mlp.*",), P.FP8_CURRENT),))
    by_unit = Policy(rules=(Rule("mlp", ("*.linear_fc1", "*.linear_fc2"), P.FP8_CURRENT),))
    for policy in (by_hf, by_unit):
        assert policy.precision_for("decoder.layers.0.mlp.linear_fc1", 4) is P.FP8_CURRENT
        assert policy.precision_for("model.layers.0.mlp.gate_proj", 4) is P.FP8_CURRENT
        assert policy.precision_for("decoder.layers.0.self_attention.linear_qkv", 4) is P.BF16
    split = Policy(rules=(Rule("gate", ("*.gate_proj",), P.FP8_CURRENT),))
    with pytest.raises(PrecisionConflict, match=r"linear_fc1 is one fused GEMM.*gate_proj: fp8_current, up_proj: bf16"):
        split.precision_for("decoder.layers.1.mlp.linear_fc1", 4)
    with pytest.raises(PrecisionConflict):  # asked by its HF name, the same unit is refused the same way
        split.precision_for("model.layers.1.mlp.up_proj", 4)
    same = Policy(rules=(Rule("gate", ("*.gate_proj",), P.FP8_CURRENT), Rule("up", ("*.up_proj",), P.FP8_CURRENT)))
    assert same.precision_for("decoder.layers.1.mlp.linear_fc1", 4) is P.FP8_CURRENT  # two rules, one precision


def test_block_selectors_work_on_unit_names():
    policy = Policy(rules=(Rule("edges", ("*",), P.BF16, first=1, last=1),), default=P.FP8_DELAYED)
    assert policy.precision_for("decoder.layers.0.mlp.linear_fc2", 4) is P.BF16
    assert policy.precision_for("decoder.layers.3.self_attention.linear_proj", 4) is P.BF16
    assert policy.precision_for("decoder.layers.2.self_attention.linear_proj", 4) is P.FP8_DELAYED
