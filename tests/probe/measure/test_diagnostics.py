"""Per-layer FP8 diagnostics and the first-bad-layer diagnosis (:mod:`precsearch.probe.measure.diagnostics`).

Faults are injected by a backend that adds a hook to one named layer at one
step, so the right answer is known exactly; the saturation case is a real
probe: delayed scaling with a hot learning rate, where the first Adam update
moves every weight by about ``lr`` while the weight scale still fits the
initial weights, so the weights saturate at step 1 (and not at step 0).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from precsearch.arch.units import unit_names
from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.fp8.formats import quantization_stats
from precsearch.fp8.scaling import ROLES
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.measure.diagnostics import (
    DiagnosticsConfig,
    FirstBad,
    TensorStats,
    first_saturated,
)
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.runner import run_probe

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
NAMES = unit_names(CFG)
CPU = torch.device("cpu")
TARGET = "decoder.layers.1.self_attention.linear_qkv"


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(load_tokens("stdlib", max_tokens=100_000, vocab_size=256, seed=0),
                        seq_len=32, micro_batch=4, seed=0, eval_batches=1)


def probe(steps: int = 6, lr: float = 3e-3, factor: float = 3.0) -> ProbeSection:
    return ProbeSection(steps=steps, micro_batch=4, seq_len=32, lr=lr, device="cpu", schedule="constant",
                        lr_warmup_steps=0, divergence_factor=factor)


def policy(precision: Precision | None, warmup: int = 0) -> Policy:
    rules = () if precision is None else (Rule(name="all", modules=("*",), precision=precision),)
    recipe = LayerRecipe(amax_history_len=1, amax_compute_algo="most_recent")
    return Policy(rules=rules, recipe=recipe, warmup_steps=warmup, clip_grad=None)


class FaultyBackend(EmulatedBackend):
    """The emulated backend, plus a fault in one layer from one step on (hooks added at convert, before the watch's).

    The fault persists, as one in the weights or the scales would: a diverged step is replayed with the
    sentinels installed (:meth:`LayerWatch.replay`), and the replay must meet it again.
    """

    def __init__(self, where: str, step: int):
        self.where, self.step = where, step

    def convert(self, model, recipes):
        model = super().convert(model, recipes)
        layer, calls = model.get_submodule(TARGET), [0]

        def count(_m, _args):
            calls[0] += 1

        def poison(t: torch.Tensor) -> torch.Tensor:
            t = t.clone()
            t.view(-1)[3] = math.inf
            return t

        layer.register_forward_pre_hook(count)
        if self.where == "input":
            layer.register_forward_pre_hook(lambda _m, args: (poison(args[0]),) if calls[0] >= self.step + 1 else None)
        elif self.where == "output":
            layer.register_forward_hook(lambda _m, _a, out: poison(out) if calls[0] >= self.step + 1 else None)
        else:  # the gradient arriving at the layer's output
            def on_output(_m, _a, out):
                if calls[0] >= self.step + 1:
                    out.register_hook(lambda g: torch.full_like(g, math.nan))
            layer.register_forward_hook(on_output)
        return model


# --- records ------------------------------------------------------------------------


def test_config_refuses_bad_values_and_collects_every_n_and_last():
    """A zero interval would divide by zero; the last step must be collected whatever the interval."""
    with pytest.raises(ValueError, match="every"):
        DiagnosticsConfig(every=0)
    with pytest.raises(ValueError, match="saturation_limit"):
        DiagnosticsConfig(saturation_limit=1.5)
    cfg = DiagnosticsConfig(every=4)
    assert [s for s in range(10) if cfg.collects(s, 10)] == [0, 4, 8, 9]


def test_tensor_stats_counts_clipped_flushed_and_nonfinite_values():
    """The shares must be of the tensor's values: 10 clipped, 5 flushed, 2 non-finite out of 1000."""
    x = torch.ones(1000)
    x[:10] = 1000.0  # beyond 448 at scale 1: saturated
    x[10:15] = 1e-6  # below half of E4M3's smallest subnormal (2**-10): flushed to zero
    x[15], x[16] = math.nan, math.inf
    stats = TensorStats.from_quantization(quantization_stats(x, 1.0, "e4m3") | {"scale": torch.tensor(1.0)},
                                          x.numel())
    assert stats.overflow == pytest.approx(10 / 1000)
    assert stats.underflow == pytest.approx(5 / 1000)
    assert stats.nonfinite == 2 and stats.scale == 1.0 and math.isnan(stats.amax)


def test_first_saturated_follows_execution_order():
    """Gradients run backward: the last layer's gradient saturates before the first layer's."""
    row = {"amax": 1.0, "scale": 1.0, "underflow": 0.0, "nonfinite": 0, "precision": "fp8_delayed"}
    rows = [
        {"step": 5, "layer": NAMES[0], "role": "input", "overflow": 0.5, **row},
        {"step": 3, "layer": NAMES[0], "role": "grad_output", "overflow": 0.5, **row},
        {"step": 3, "layer": NAMES[2], "role": "grad_output", "overflow": 0.5, **row},
        {"step": 3, "layer": NAMES[4], "role": "weight", "overflow": 0.0001, **row},  # below the limit
    ]
    assert first_saturated(rows, NAMES, 0.001) == FirstBad(3, NAMES[2], "grad_output", "overflow", 0.5)
    assert first_saturated(rows, NAMES, 0.9) is None


# --- the emulated backend's statistics ------------------------------------------------


def test_probe_collects_every_fp8_layer_and_role_at_collection_steps(data):
    """Rows must cover every FP8 layer x role at steps 0, every, last, and none in the BF16 warm-up."""
    result = run_probe(CFG, probe(steps=7), policy(Precision.FP8_CURRENT, warmup=1), data, EmulatedBackend(), CPU,
                       diagnostics=DiagnosticsConfig(every=3))
    steps = sorted({r["step"] for r in result.layer_stats})
    assert steps == [3, 6]  # step 0 is a BF16 warm-up step: nothing was quantized
    assert len(result.layer_stats) == 2 * len(NAMES) * len(ROLES)
    for r in result.layer_stats:
        assert r["precision"] == "fp8_current" and 0 <= r["underflow"] <= 1 and r["nonfinite"] == 0
        assert r["overflow"] == 0  # current scaling fits every tensor's amax
        assert r["scale"] == pytest.approx(448 / r["amax"], rel=1e-6) if r["role"] != "grad_output" else True
    assert not result.diverged and result.first_bad is None


def test_statistics_are_switched_off_between_collection_steps():
    """Stale statistics from an earlier step would be reported as this step's."""
    backend = EmulatedBackend()
    model = nn.Sequential(nn.Linear(32, 32))
    backend.convert(model, {"0": LayerRecipe(Precision.FP8_BLOCK)})
    x = torch.randn(8, 32)
    backend.track_stats(model, True)
    model(x).sum().backward()
    stats = backend.layer_stats(model)
    assert set(stats) == {"0"} and set(stats["0"]) == set(ROLES)
    assert stats["0"]["weight"].scale is None  # block scales vary along the tensor
    backend.track_stats(model, False)
    model(x).sum().backward()
    assert backend.layer_stats(model) == {}


# --- the diagnosis ----------------------------------------------------------------------


@pytest.mark.parametrize("where, tensor", [("output", "output"), ("input", "input"), ("grad", "grad_output")])
def test_first_nonfinite_value_is_named(data, where, tensor):
    """The injected layer, tensor and step must be named, not the layers its NaN/inf spread to."""
    result = run_probe(CFG, probe(), policy(Precision.FP8_DELAYED), data, FaultyBackend(where, step=2), CPU)
    assert result.diverged and result.diverged_step == 2
    bad = result.first_bad
    assert (bad["step"], bad["layer"], bad["tensor"], bad["kind"]) == (2, TARGET, tensor, "nonfinite")
    assert bad["value"] >= 1
    assert f"first bad layer {TARGET}" in result.reason and "at step 2" in result.reason


def test_bf16_layers_are_watched_too(data):
    """A non-finite value in a BF16 layer must be found: the sentinels do not depend on FP8."""
    result = run_probe(CFG, probe(), policy(None), data, FaultyBackend("output", step=1), CPU)
    assert result.first_bad["layer"] == TARGET and result.first_bad["tensor"] == "output"
    assert result.layer_stats == []


def test_stale_delayed_weight_scale_is_diagnosed(data):
    """Delayed scaling at a hot lr: weights saturate at step 1, after the first Adam update.

    The loss blow-up is declared with a tight divergence factor so that the test
    does not hang on the chaotic part of a hot-lr run; what is checked is the
    diagnosis: the first Linear's weight at step 1, nothing at step 0 (the
    scale was fitted to those very weights), and no diagnosis at all for the
    BF16 run that blows up too (it has no FP8 casts to blame).
    """
    hot = probe(steps=8, lr=0.3, factor=1.2)
    result = run_probe(CFG, hot, policy(Precision.FP8_DELAYED), data, EmulatedBackend(), CPU,
                       diagnostics=DiagnosticsConfig(every=1))
    assert result.diverged
    bad = result.first_bad
    assert (bad["step"], bad["layer"], bad["tensor"], bad["kind"]) == (1, NAMES[0], "weight", "overflow")
    assert bad["value"] > 0.5  # most of the weight clipped, not a stray value
    assert all(r["overflow"] <= 0.001 for r in result.layer_stats if r["step"] == 0)
    assert "first bad layer decoder.layers.0.self_attention.linear_qkv" in result.reason
    bf16 = run_probe(CFG, hot, policy(None), data, EmulatedBackend(), CPU)
    assert bf16.diverged and bf16.first_bad is None and "first bad" not in bf16.reason
