"""Bad input, class "aliases" (issue 34): a Hugging Face name is an alias of a probe unit everywhere.

One table of patterns, each written in both schemes (Megatron-Core units and the Hugging Face names
they compute), with and without a block selector. Every row must give the same layers (a) when a
policy rule is applied to the probe (``PolicyRuntime.plan``) and (b) when a space group names it
(``precsearch validate``). A row failing here means one scheme is accepted in one place and refused
(or matched differently) in the other, as ``model.layers.*`` with ``layers: {last: 1}`` was.
"""

from __future__ import annotations

import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.arch.config import PRESETS
from precsearch.backends.policy_runtime import PolicyRuntime
from precsearch.cli import main
from precsearch.policy.rules import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.model.llama3 import build_model

#: (id, canonical patterns, Hugging Face patterns, block selector) - both columns name the same units.
ROWS = [
    ("every_block_last_1", ("decoder.layers.*",), ("model.layers.*",), {"last": 1}),
    ("every_block_first_1", ("decoder.layers.*",), ("model.layers.*",), {"first": 1}),
    ("attention", ("*.self_attention.*",), ("*.self_attn.*",), {}),
    ("attention_index_0", ("*.self_attention.*",), ("*.self_attn.*",), {"indices": [0]}),
    ("mlp_last_1", ("decoder.layers.*.mlp.*",), ("model.layers.*.mlp.*",), {"last": 1}),
    ("fc1", ("*.mlp.linear_fc1",), ("*.mlp.gate_proj", "*.mlp.up_proj"), {}),
    ("qkv_last_1", ("*.linear_qkv",), ("*.q_proj", "*.k_proj", "*.v_proj"), {"last": 1}),
    ("head", ("output_layer",), ("lm_head",), {}),
]


@pytest.fixture(scope="module")
def probe():
    return build_model(PRESETS["tiny"].with_overrides(n_layers=2), seed=0)


def _fp8_layers(probe, modules: tuple[str, ...], selector: dict) -> set[str]:
    policy = Policy(rules=(Rule("r", modules, Precision.FP8_CURRENT, **selector),))
    return {name for name, p in PolicyRuntime(policy).precisions(probe).items() if p is Precision.FP8_CURRENT}


@pytest.mark.parametrize("canonical, hf, selector", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_both_schemes_select_the_same_probe_layers(probe, canonical, hf, selector):
    want = _fp8_layers(probe, canonical, selector)
    assert want, "the canonical pattern itself must select some layer, or the comparison is vacuous"
    assert _fp8_layers(probe, hf, selector) == want


@pytest.mark.parametrize("canonical, hf, selector", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
@pytest.mark.parametrize("scheme", ["canonical", "hf"])
def test_both_schemes_validate_as_a_space_group(tmp_path, capsys, canonical, hf, selector, scheme):
    group = {"name": "g", "modules": list(canonical if scheme == "canonical" else hf),
             "precision": {"choices": ["bf16", "fp8_current"]}}
    if selector:
        group["layers"] = selector
    path = write_space(tmp_path, tiny_space_dict(**{"search.groups": [group]}))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
