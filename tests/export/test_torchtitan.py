"""torchtitan export: names, filter_fqns under torchtitan's substring rule, TOML, inexpressible parts.

Reference (pytorch/torchtitan, tag v0.2.2): ``torchtitan/config/job_config.py`` (``Float8Linear``:
``recipe_name``, ``filter_fqns``; ``Model.converters``; ``Training.max_norm``),
``torchtitan/components/quantization/float8.py`` (converter registered as
``quantize.linear.float8``), ``torchtitan/components/quantization/utils.py::module_filter_fn``
(``any(filter_fqn in fqn for filter_fqn in filter_fqns)``), ``torchtitan/models/llama3/model/model.py``.
"""

from __future__ import annotations

import math
import random

import pytest

from precsearch.export.registry import render
from precsearch.arch.units import hf_linear_names
from precsearch.export.format_output import layer_table
from precsearch.export.torchtitan import (
    CONVERTER,
    FILE,
    MX_CONVERTER,
    filter_fqns_for,
    is_filtered,
    torchtitan_export,
    tt_name,
)
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision

P = Precision
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_hf_names_map_to_torchtitan_llama_names():
    assert tt_name("model.layers.0.self_attn.q_proj") == "layers.0.attention.wq"
    assert tt_name("model.layers.0.self_attn.k_proj") == "layers.0.attention.wk"
    assert tt_name("model.layers.0.self_attn.v_proj") == "layers.0.attention.wv"
    assert tt_name("model.layers.0.self_attn.o_proj") == "layers.0.attention.wo"
    assert tt_name("model.layers.5.mlp.gate_proj") == "layers.5.feed_forward.w1"
    assert tt_name("model.layers.5.mlp.up_proj") == "layers.5.feed_forward.w3"
    assert tt_name("model.layers.5.mlp.down_proj") == "layers.5.feed_forward.w2"
    assert tt_name("lm_head") == "output"
    with pytest.raises(ValueError):
        tt_name("model.embed_tokens")


@pytest.mark.parametrize("seed", range(20))
def test_filter_entries_skip_exactly_the_bf16_layers(seed):
    """Random keep-sets over 23 blocks (so layers.1. / layers.1x / layers.2x collide if done wrong)."""
    rng = random.Random(seed)
    n = 23
    fqns = [tt_name(n_) for n_ in hf_linear_names(n)]
    density = rng.choice([0.05, 0.3, 0.7, 0.95])
    keep = {f for f in fqns if rng.random() < density}
    if rng.random() < 0.5:  # a projection kept in every block, and a whole block
        keep |= {f for f in fqns if f.endswith("attention.wv")} | {f for f in fqns if f.startswith("layers.1.")}
    filters = filter_fqns_for(keep, n)
    assert {f for f in fqns if is_filtered(f, filters)} == keep
    assert len(filters) <= len(keep)


def test_filter_entries_are_short_for_common_shapes():
    keep = {tt_name(n) for n in hf_linear_names(32) if ".layers.0." in n or ".layers.31." in n or "k_proj" in n}
    keep.add("output")
    assert filter_fqns_for(keep, 32) == ["attention.wk", "layers.0.", "layers.31.", "output"]


def _toml(policy: Policy, n_layers: int = 8) -> tuple[dict, list[str], str]:
    rendered = render("torchtitan", policy, n_layers, {"study": "s", "trial": 2})
    text = rendered.files[FILE]
    return tomllib.loads(text), rendered.warnings, text


def test_tensorwise_policy_becomes_a_float8_converter_section():
    policy = Policy(rules=(Rule("edges", ("*",), P.BF16, first=1, last=1), Rule("head", ("lm_head",), P.BF16),
                           Rule("all", ("model.*",), P.FP8_CURRENT)), clip_grad=1.0)
    data, warnings, text = _toml(policy)
    assert data["model"]["converters"] == [CONVERTER] == ["quantize.linear.float8"]
    section = data["quantize"]["linear"]["float8"]
    assert section == {"recipe_name": "tensorwise", "filter_fqns": ["layers.0.", "layers.7.", "output"]}
    assert data["training"]["max_norm"] == 1.0
    assert warnings == [] and "WARNING" not in text
    # torchtitan 0.3 (Python configs, rowwise recipes only) cannot take these sections: the file says so
    assert "v0.3 and later are configured in Python" in text
    table = layer_table(policy, 8)
    assert all(is_filtered(tt_name(n), section["filter_fqns"]) == (p is P.BF16) for n, p in table.items())


def test_inexpressible_layers_stay_bf16_with_warnings():
    policy = Policy(rules=(Rule("attn", ("*.self_attn.*",), P.FP8_CURRENT), Rule("fc2", ("*.down_proj",), P.FP8_BLOCK),
                           Rule("mlp", ("*.mlp.*",), P.FP8_DELAYED), Rule("head", ("lm_head",), P.MXFP8)),
                    recipe=LayerRecipe(fp8_format="e4m3"), warmup_steps=5, clip_grad=None)
    data, warnings, text = _toml(policy, 4)
    section = data["quantize"]["linear"]["float8"]
    assert section["filter_fqns"] == ["feed_forward.w1", "feed_forward.w3", "feed_forward.w2", "output"]
    assert data["training"]["max_norm"] == math.inf
    joined = "\n".join(warnings)
    assert "8 fp8_delayed layer(s) (gate_proj in blocks 0-3; up_proj in blocks 0-3) kept BF16" in joined
    assert "no delayed scaling" in joined
    assert "4 fp8_block layer(s) (down_proj in blocks 0-3) kept BF16" in joined
    assert "1 mxfp8 layer(s) (lm_head) kept BF16" in joined
    assert "casts gradients to E5M2" in joined and "no FP8 warm-up" in joined
    assert all(f"# WARNING: {w}" in text for w in warnings)


def test_nothing_expressible_writes_no_converter():
    data, warnings, _ = _toml(Policy(default=P.FP8_DELAYED, clip_grad=2.0))
    assert "model" not in data and "quantize" not in data and data["training"]["max_norm"] == 2.0
    assert any("only [training] max_norm is written" in w for w in warnings)
    settings, warnings = torchtitan_export(Policy(), 4)
    assert settings["converters"] == [] and warnings == []


@pytest.mark.parametrize("seed", range(4))
def test_per_module_tensorwise_policy_is_carried_exactly(seed):
    """A per-module space's trial (each unit its own bf16/fp8_current choice): filter_fqns skip exactly
    the BF16 units, q/k/v and gate/up together (issue 17)."""
    from _spaces import per_module_policy

    policy = per_module_policy(6, seed, ("bf16", "fp8_current"))
    data, warnings, _ = _toml(policy, 6)
    assert warnings == []
    filters = data["quantize"]["linear"]["float8"]["filter_fqns"]
    table = layer_table(policy, 6)
    assert all(is_filtered(tt_name(n), filters) == (p is P.BF16) for n, p in table.items())


def test_per_module_units_torchtitan_cannot_run_are_named_and_kept_bf16():
    from _spaces import per_module_policy

    policy = per_module_policy(4, 3, ("fp8_current", "fp8_block"))
    data, warnings, _ = _toml(policy, 4)
    table = layer_table(policy, 4)
    block = [n for n, p in table.items() if p is P.FP8_BLOCK]
    assert block and any(f"{len(block)} fp8_block layer(s)" in w and "kept BF16" in w for w in warnings)
    filters = data["quantize"]["linear"]["float8"]["filter_fqns"]
    assert all(is_filtered(tt_name(n), filters) == (p is not P.FP8_CURRENT) for n, p in table.items())


def test_mxfp8_majority_becomes_the_mx_converter():
    """MXFP8 layers must reach torchao's MX converter with TE's scale rounding (RCEIL); fp8_current layers,
    which torchtitan cannot convert beside them, stay BF16 with a warning, as do NVFP4 ones."""
    policy = Policy(rules=(Rule("edges", ("*",), P.BF16, last=1), Rule("qkv", ("*.q_proj", "*.k_proj", "*.v_proj"),
                                                                      P.FP8_CURRENT, first=1),
                           Rule("fc2", ("*.down_proj",), P.NVFP4), Rule("rest", ("model.*",), P.MXFP8)),
                    recipe=LayerRecipe(fp8_format="hybrid"))
    data, warnings, text = _toml(policy, 4)
    assert data["model"]["converters"] == [MX_CONVERTER] == ["quantize.linear.mx"]
    section = data["quantize"]["linear"]["mx"]
    assert section["recipe_name"] == "mxfp8_cublas_rceil" and "float8" not in data["quantize"]["linear"]
    table = layer_table(policy, 4)
    assert all(is_filtered(tt_name(n), section["filter_fqns"]) == (p is not P.MXFP8) for n, p in table.items())
    joined = "\n".join(warnings)
    assert "3 fp8_current layer(s) (q_proj in blocks 0; k_proj in blocks 0; v_proj in blocks 0) kept BF16" in joined
    assert "cannot combine its float8 and mx converters" in joined
    assert "3 nvfp4 layer(s) (down_proj in blocks 0-2) kept BF16" in joined and "no nvfp4 recipe" in joined
    assert "casts gradients to E4M3" in joined
