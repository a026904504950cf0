"""The sensitivity estimators: the switched forward is what the emulated backend computes; scores behave."""

from __future__ import annotations

import math

import pytest
import torch

from precsearch.backends.emulated import EmulatedBackend
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.model.llama3 import ModelConfig, build_model
from precsearch.probe.runner import build_probe
from precsearch.probe.measure.sensitivity import _switched, unit_scores

CFG = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
CPU = torch.device("cpu")


def _batches(n: int = 2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g))
            for _ in range(n)]


def _loss(model, batch):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return float(model(*batch))


@pytest.mark.parametrize("unit", ["decoder.layers.1.self_attention.linear_qkv", "decoder.layers.0.mlp.linear_fc2",
                                  "output_layer"])
@pytest.mark.parametrize("precision", [Precision.FP8_CURRENT, Precision.FP8_BLOCK])
def test_switched_forward_equals_the_emulated_backend_converting_that_unit(unit, precision):
    """The forward estimator's one-unit switch must compute what converting the unit computes
    (else it scores a different numeric than the probes run); the fused RMSNorm included."""
    plain = build_model(CFG, 0, CPU)
    converted = build_probe(CFG, Policy(rules=(Rule("u", (unit,), precision),)), EmulatedBackend(), CPU, 0)
    batch = _batches(1)[0]
    with _switched(plain.get_submodule(unit), LayerRecipe(precision=precision)):
        switched = _loss(plain, batch)
    assert switched == pytest.approx(_loss(converted, batch), rel=1e-5)
    assert switched != _loss(plain, batch)  # the switch changed something


def test_scores_cover_every_unit_and_low_precision_and_taylor_is_nonnegative():
    model = build_model(CFG, 0, CPU)
    units = ["decoder.layers.0.self_attention.linear_qkv", "output_layer"]
    precisions = [Precision.BF16, Precision.FP8_CURRENT, Precision.MXFP8]
    for est in ("forward", "taylor"):
        scores = unit_scores(est, model, units, precisions, LayerRecipe(), _batches(), CPU)
        assert set(scores) == {(u, p) for u in units for p in precisions[1:]}  # BF16 is the reference
        assert all(math.isfinite(v) for v in scores.values())
    taylor = unit_scores("taylor", model, units, precisions, LayerRecipe(), _batches(), CPU)
    assert all(v > 0 for v in taylor.values())
    assert all(p.grad is None for p in model.parameters())  # the estimate leaves no gradients behind


def test_nvfp4_scores_follow_the_recipe_switches():
    """The scores use the recipe's NVFP4 switches (16x16 vs 1x16 weight tiles change Q(W)), not the defaults."""
    model = build_model(CFG, 0, CPU)
    units = ["decoder.layers.0.mlp.linear_fc1"]
    scores = [unit_scores(est, model, units, [Precision.NVFP4], LayerRecipe(nvfp4_2d_weights=two_d), _batches(), CPU)
              for est in ("forward", "taylor") for two_d in (True, False)]
    assert scores[0] != scores[1] and scores[2] != scores[3]


def test_the_pass_scores_with_the_spaces_first_recipe_choices():
    from _spaces import tiny_space_dict
    from precsearch.config.loader import parse_space
    from precsearch.search.sensitivity import first_recipe

    space = parse_space(tiny_space_dict(**{"search.recipe.nvfp4_2d_weights": {"choices": [False, True]},
                                           "search.recipe.margin": 2}))
    recipe = first_recipe(space)
    assert (recipe.nvfp4_2d_weights, recipe.margin, recipe.nvfp4_rht) == (False, 2, True)


def test_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="forward, taylor"):
        unit_scores("magic", build_model(CFG, 0, CPU), [], [Precision.FP8_CURRENT], LayerRecipe(), [], CPU)


def test_unit_timing_times_every_unit_forward_and_backward():
    """CPU wall clock here (the H200 script uses CUDA events): each unit gets one positive median time,
    and the hooks are gone afterwards (a later step must not append spans)."""
    from precsearch.probe.measure.unit_timing import time_units

    model = build_model(CFG, 0, CPU)
    batch = _batches(1)[0]

    def step():
        model(*batch).backward()
        model.zero_grad(set_to_none=True)

    units = ["decoder.layers.0.mlp.linear_fc1", "output_layer"]
    times = time_units(model, units, step, warmup=1, repeats=3)
    assert set(times) == set(units) and all(t > 0 for t in times.values())
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())


def test_units_fused_into_one_module_are_timed_together():
    """The TE stack's te.LayerNormMLP runs fc1 and fc2 as one module: both units report its time."""
    from torch import nn

    from precsearch.probe.measure.unit_timing import time_units, timed_module

    class Fused(nn.Module):
        def __init__(self):
            super().__init__()
            self.layernorm_mlp = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))

        def forward(self, x):
            return self.layernorm_mlp(x)

    model = nn.Module()
    model.mlp = Fused()
    x = torch.randn(4, 8, requires_grad=True)
    step = lambda: model.mlp(x).sum().backward()  # noqa: E731
    assert timed_module(model, "mlp.linear_fc1") == timed_module(model, "mlp.linear_fc2") == "mlp.layernorm_mlp"
    with pytest.raises(AttributeError):
        timed_module(model, "mlp.linear_qkv")
    times = time_units(model, ["mlp.linear_fc1", "mlp.linear_fc2"], step, warmup=1, repeats=3)
    assert times["mlp.linear_fc1"] == times["mlp.linear_fc2"] > 0
