"""GPU-only checks of the Transformer Engine and torchao backends (run by benchmarks/gpu/gpu_check.sh).

These prove on real hardware what the CPU cannot: that each layer ran the
precision its policy assigned (from TE's own per-module state), that the BF16
warm-up toggle works and keeps delayed-scaling state, that TE's delayed-scaling
bookkeeping runs once per step under :meth:`TEBackend.autocast`, that the
capability table agrees with TE's own checks, that torchao converts only the
filtered layers, and that the FusedAdam memory knobs build and step.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from precsearch.arch.units import unit_names
from precsearch.backends.base import UnsupportedRecipe
from precsearch.backends.capability import gpu_capability, te_import_error, torchao_import_error
from precsearch.precision import Fp8Format, LayerRecipe, Precision
from precsearch.probe.model.llama3 import ModelConfig, build_model

CUDA = torch.cuda.is_available()
CAP = gpu_capability("cuda") if CUDA else None

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
_TE_ERROR = te_import_error() if CUDA else "no CUDA GPU"
needs_te = pytest.mark.skipif(_TE_ERROR is not None, reason=str(_TE_ERROR))
needs_torchao = pytest.mark.skipif(
    not CUDA or torchao_import_error() is not None or CAP < (8, 9),
    reason="needs torchao and a GPU of compute capability 8.9+",
)

DEV = torch.device("cuda")
CFG = ModelConfig(vocab_size=256, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=64)
NAMES = unit_names(CFG)
#: One layer per Hopper TE recipe; everything else BF16.
MIXED = {
    "decoder.layers.0.self_attention.linear_qkv": Precision.FP8_DELAYED,
    "decoder.layers.0.mlp.linear_fc2": Precision.FP8_CURRENT,
    "decoder.layers.1.mlp.linear_fc1": Precision.FP8_BLOCK,
    "output_layer": Precision.FP8_DELAYED,
}
TE_RECIPE_CLASS = {
    Precision.FP8_DELAYED: "DelayedScaling",
    Precision.FP8_CURRENT: "Float8CurrentScaling",
    Precision.FP8_BLOCK: "Float8BlockScaling",
}
TE_QUANTIZER_CLASS = {
    Precision.FP8_DELAYED: "Float8Quantizer",
    Precision.FP8_CURRENT: "Float8CurrentScalingQuantizer",
    Precision.FP8_BLOCK: "Float8BlockQuantizer",
}
HISTORY = 8
E4M3_MAX = 448.0


def recipes(fp8: dict[str, Precision]) -> dict[str, LayerRecipe]:
    return {n: LayerRecipe(p, amax_history_len=HISTORY) for n, p in fp8.items()}


def ids(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (4, 32), generator=gen).to(DEV)


def train_step(backend, model, enabled: bool, seed: int = 0) -> float:
    """One forward/backward as the probe runner does it (no optimizer step)."""
    tok = ids(seed)
    with backend.autocast(model, enabled=enabled), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(tok, tok)
    loss.backward()
    return float(loss)


def te_model(fp8: dict[str, Precision], **kwargs):
    from precsearch.backends.te import TEBackend

    backend = TEBackend(**kwargs)
    return backend, backend.convert(build_model(CFG, 0, DEV), recipes(fp8))


def hopper_mix() -> dict[str, Precision]:
    """:data:`MIXED` without block scaling where this GPU/CUDA cannot run it."""
    from precsearch.backends.te import TEBackend

    table = TEBackend().supported_precisions(DEV)
    return {n: p for n, p in MIXED.items() if table[p] is None}


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    noise = (ref.double() - approx.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(ref.double().pow(2).sum().item() / noise)


# --- Transformer Engine ----------------------------------------------------------------


@needs_te
def test_te_capability_table_agrees_with_te():
    """Our table must refuse exactly what TE itself would refuse on this GPU."""
    import transformer_engine.pytorch as te

    from precsearch.backends.te import TEBackend

    table = TEBackend().supported_precisions(DEV)
    te_says = {
        Precision.FP8_DELAYED: te.is_fp8_available(),
        Precision.FP8_CURRENT: te.is_fp8_available(),
        Precision.FP8_BLOCK: te.is_fp8_block_scaling_available(),
        Precision.MXFP8: te.is_mxfp8_available(),
        Precision.NVFP4: te.is_nvfp4_available(),
    }
    for precision, available in te_says.items():
        assert (table[precision] is None) == bool(available), (precision, table[precision])


@needs_te
@pytest.mark.skipif(CAP is None or CAP[0] != 9, reason="checks Hopper (compute capability 9.x)")
def test_te_refuses_blackwell_recipes_on_hopper():
    from precsearch.backends.te import TEBackend

    backend = TEBackend()
    table = backend.supported_precisions(DEV)
    this_gpu = f"this GPU is {CAP[0]}.{CAP[1]} (Hopper)"
    assert table[Precision.MXFP8] == f"MXFP8 needs compute capability 10.0 (Blackwell); {this_gpu}"
    assert table[Precision.NVFP4].startswith("NVFP4 needs compute capability 10.0 (Blackwell)")
    for precision in (Precision.MXFP8, Precision.NVFP4):
        model = build_model(CFG, 0, DEV)
        with pytest.raises(UnsupportedRecipe, match=precision.value):
            backend.convert(model, {"output_layer": LayerRecipe(precision)})
        assert backend.converted_layers(model) == {}


@needs_te
def test_te_recipe_objects_match_layer_recipes_and_are_shared():
    from transformer_engine.common.recipe import Format

    from precsearch.backends.te import make_te_recipe

    delayed = make_te_recipe(LayerRecipe(Precision.FP8_DELAYED, Fp8Format.E4M3, 16, "most_recent", 1))
    assert type(delayed).__name__ == "DelayedScaling"
    assert (delayed.fp8_format, delayed.amax_history_len, delayed.amax_compute_algo, delayed.margin) == (
        Format.E4M3, 16, "most_recent", 1,
    )
    assert make_te_recipe(LayerRecipe(Precision.FP8_CURRENT)).fp8_format == Format.HYBRID
    _, model = te_model(hopper_mix())
    assert model.get_submodule("decoder.layers.0.self_attention.linear_qkv").te_recipe is model.output_layer.te_recipe


@needs_te
def test_te_nvfp4_recipe_takes_the_switches():
    """Each NVFP4 switch must reach TE's NVFP4BlockScaling (the object is built without a Blackwell GPU;
    running it needs compute capability 10.x, which this test does not ask for)."""
    from precsearch.backends.te import make_te_recipe

    default = make_te_recipe(LayerRecipe(Precision.NVFP4))
    assert type(default).__name__ == "NVFP4BlockScaling"
    assert not (default.disable_rht or default.disable_stochastic_rounding or default.disable_2d_quantization)
    assert default.fp4_quant_fwd_weight.fp4_2d_quantization and default.fp4_quant_bwd_grad.stochastic_rounding
    off = make_te_recipe(LayerRecipe(Precision.NVFP4, nvfp4_rht=False, nvfp4_2d_weights=False,
                                     nvfp4_stochastic_rounding=False))
    assert off.disable_rht and off.disable_stochastic_rounding and off.disable_2d_quantization
    assert not off.fp4_quant_fwd_inp.random_hadamard_transform


@needs_te
def test_te_fp8_ran_only_where_assigned():
    """TE's own per-module state proves which layers ran which recipe."""
    fp8 = hopper_mix()
    backend, model = te_model(fp8)
    assert backend.converted_layers(model) == fp8
    units = {u: m for m in model.modules() if hasattr(m, "units") for u in m.units}
    assert set(units) == set(NAMES)  # the probe is rebuilt from TE modules, BF16 units too
    train_step(backend, model, enabled=True)
    for name in NAMES:
        if name not in fp8:
            assert not units[name].is_fp8 and not units[name].linear.fp8, name  # TE's own flag: ran BF16
    meta = backend.fp8_metadata(model)
    assert meta.keys() == fp8.keys()
    for name, precision in fp8.items():
        info = meta[name]
        assert info["fp8_ran"] and info["recipe"] == TE_RECIPE_CLASS[precision], (name, info)
        assert TE_QUANTIZER_CLASS[precision] in info["fwd_quantizers"], (name, info["fwd_quantizers"])
        if precision is Precision.FP8_DELAYED:
            assert info["amax_history"]["input"].abs().max() > 0, name
            assert info["amax_history"]["grad_output"].abs().max() > 0, name
            assert info["scale"]["input"] != 1.0, name
        else:
            assert info["scale"] == {}, name  # no delayed-scaling state


@needs_te
def test_te_outputs_differ_from_bf16_only_on_fp8_layers():
    fp8 = hopper_mix()
    backend, model = te_model(fp8)
    ref = build_model(CFG, 0, DEV)
    for _ in range(2):  # delayed scaling calibrates over the first steps
        train_step(backend, model, enabled=True)
    for name in NAMES:
        ref_layer = ref.get_submodule(name)
        x = torch.randn(4, 32, ref_layer.in_features, device=DEV)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            expected = ref_layer(x)
            with backend.autocast(model, enabled=True):
                actual = model.get_submodule(name)(x)
        with torch.no_grad():  # float64 weights (a fused input norm computes in float32)
            exact = copy.deepcopy(ref_layer).double()(x.double())
        if name in fp8:
            assert not torch.equal(actual, expected), name
            assert 20 < sqnr_db(exact, actual) < sqnr_db(exact, expected) - 6, name
        else:  # a TE module in BF16: BF16's agreement with the exact product, not torch's bits
            assert sqnr_db(exact, actual) > sqnr_db(exact, expected) - 3, name


@needs_te
def test_te_warmup_toggle_runs_bf16_and_keeps_delayed_state():
    fp8 = hopper_mix()
    backend, model = te_model(fp8)
    train_step(backend, model, enabled=False)
    assert not any(info["fp8_ran"] for info in backend.fp8_metadata(model).values())
    train_step(backend, model, enabled=True)
    meta = backend.fp8_metadata(model)
    assert all(info["fp8_ran"] for info in meta.values())
    before = {n: info["scale"].get("input") for n, info in meta.items()}
    train_step(backend, model, enabled=False)
    after = backend.fp8_metadata(model)
    assert not any(info["fp8_ran"] for info in after.values())
    for name, scale in before.items():
        if scale is not None:  # a BF16 step neither drops nor updates delayed-scaling state
            assert torch.equal(after[name]["scale"]["input"], scale), name
    assert all(m.fp8_enabled for m in model.modules() if hasattr(m, "fp8_enabled"))


@needs_te
def test_te_delayed_scaling_updates_once_per_step(monkeypatch):
    """Nested per-layer contexts must give one amax/scale update per step, not one per layer."""
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    calls: list[bool] = []
    original = FP8GlobalStateManager.reduce_and_update_fp8_tensors

    def counting(cls, forward: bool = True) -> None:
        calls.append(forward)
        original(forward=forward)

    monkeypatch.setattr(FP8GlobalStateManager, "reduce_and_update_fp8_tensors", classmethod(counting))
    fp8 = {n: Precision.FP8_DELAYED for n in MIXED}
    backend, model = te_model(fp8)
    steps = 3
    for step in range(steps):
        train_step(backend, model, enabled=True, seed=step)
    assert calls == [True, False] * steps
    for name, info in backend.fp8_metadata(model).items():
        for slot in ("input", "grad_output"):
            history = info["amax_history"][slot]
            assert (history != 0).sum() == steps and history[0] == 0, (name, slot, history)
        expected = E4M3_MAX / info["amax_history"]["input"].max()
        assert torch.isclose(info["scale"]["input"], expected, rtol=1e-5), name
    # without the outer context every layer is its own outermost context: one update per layer
    calls.clear()
    tok = ids(9)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(tok, tok)
    loss.backward()
    assert calls.count(True) == len(fp8) and calls.count(False) == len(fp8)


@needs_te
def test_te_refuses_feature_dims_fp8_cannot_take():
    from precsearch.backends.te import TEBackend

    model = nn.Sequential(nn.Linear(24, 48, bias=False), nn.Linear(48, 64)).to(DEV)
    with pytest.raises(UnsupportedRecipe, match="divisible by 16"):
        TEBackend().convert(model, {"0": LayerRecipe(Precision.FP8_CURRENT)})
    TEBackend().convert(model, {"1": LayerRecipe(Precision.FP8_CURRENT)})
    assert TEBackend().converted_layers(model) == {"1": Precision.FP8_CURRENT}


@needs_te
def test_te_bias_and_weights_copied():
    from precsearch.backends.te import TEBackend

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32)).to(DEV)
    weight, bias = model[0].weight.detach().clone(), model[0].bias.detach().clone()
    TEBackend().convert(model, {"0": LayerRecipe(Precision.FP8_CURRENT)})
    assert torch.equal(model[0].weight.detach(), weight) and torch.equal(model[0].bias.detach(), bias)
    assert [n for n, _ in model.named_parameters()] == ["0.linear.weight", "0.linear.bias"]


# --- FusedAdam and FP8 weights ---------------------------------------------------------


@needs_te
@pytest.mark.parametrize(
    "exp_avg, exp_avg_sq",
    [("fp32", "fp32"), ("bf16", "bf16"), ("bf16", "fp32"), ("fp8", "fp32"), ("fp8", "fp8")],
)
def test_fused_adam_knobs_build_and_step(exp_avg, exp_avg_sq):
    from precsearch.backends.te_optimizer import OPTIMIZER_STATE_DTYPES, build_optimizer

    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(64, 64, device=DEV) * 0.02) for _ in range(2)]
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    opt = build_optimizer(params, 1e-3, (0.9, 0.95), 0.1, master_weights=False,
                          exp_avg_dtype=exp_avg, exp_avg_sq_dtype=exp_avg_sq)
    ref = torch.optim.AdamW(twins, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, t, g in zip(params, twins, grads):
            p.grad, t.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    state = opt.state[params[0]]
    for key, name in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if name == "fp8":
            assert type(state[key]).__name__ == "Float8Tensor"
        else:
            assert state[key].dtype == OPTIMIZER_STATE_DTYPES[name]
    for p, t in zip(params, twins):
        assert torch.isfinite(p).all()
        if (exp_avg, exp_avg_sq) == ("fp32", "fp32"):
            torch.testing.assert_close(p, t, rtol=1e-5, atol=1e-6)
        elif "fp8" not in (exp_avg, exp_avg_sq):  # BF16 moments: updates of ~1e-3 within ~1%
            assert (p - t).abs().max() < 5e-5


@needs_te
def test_te_fp8_weights_train_with_master_weights():
    """Experimental: FP8 primary weights need FusedAdam master weights seeded from FP32 values."""
    import transformer_engine.pytorch as te

    from precsearch.backends.te_optimizer import build_optimizer, seed_master_weights

    fp8 = {"decoder.layers.0.mlp.linear_fc2": Precision.FP8_CURRENT, "output_layer": Precision.FP8_CURRENT}
    backend, model = te_model(fp8, fp8_weights=True)
    assert backend.needs_master_weights
    ref = build_model(CFG, 0, DEV)
    for name in fp8:
        weight = model.get_submodule(name).weight
        assert isinstance(weight, te.QuantizedTensor), name
        exact = ref.get_submodule(name).weight.detach()
        assert sqnr_db(exact, weight.dequantize().float()) > 25, name
    opt = build_optimizer(model.parameters(), 3e-3, (0.9, 0.95), 0.1, master_weights=True)
    assert seed_master_weights(opt) == len(fp8)
    for name in fp8:
        master = opt.get_unscaled_state(model.get_submodule(name).weight, "master_param")
        torch.testing.assert_close(master, ref.get_submodule(name).weight.detach(), rtol=0, atol=0)
    losses = []
    for step in range(4):
        losses.append(train_step(backend, model, enabled=True, seed=step))
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses


# --- torchao ---------------------------------------------------------------------------


@needs_torchao
def test_torchao_converts_only_filtered_layers_and_keeps_parameters():
    from precsearch.backends.torchao_backend import TorchaoBackend, TorchaoPrecisionLinear

    fp8 = {"decoder.layers.0.self_attention.linear_qkv": Precision.FP8_CURRENT, "output_layer": Precision.FP8_CURRENT}
    model = build_model(CFG, 0, DEV)
    before = {n: model.get_submodule(n).weight for n in fp8}
    backend = TorchaoBackend()
    backend.convert(model, recipes(fp8) | {"decoder.layers.1.mlp.linear_fc1": LayerRecipe()})
    assert backend.converted_layers(model) == fp8
    for name in NAMES:
        module = model.get_submodule(name)
        if name in fp8:
            assert isinstance(module, TorchaoPrecisionLinear)
            assert type(module.linear).__name__ == "Float8Linear"
            assert module.weight is before[name]  # torchao keeps the Parameter object
        else:
            assert isinstance(module, nn.Linear), name  # untouched (NormLinear for the fused-norm units)
    ref = build_model(CFG, 0, DEV)
    x = torch.randn(4, 32, CFG.dim, device=DEV)
    layer = model.get_submodule("output_layer")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        expected = ref.output_layer(x)
        with backend.autocast(model, enabled=False):
            assert torch.equal(layer(x), expected)
        with backend.autocast(model, enabled=True):
            fp8_out = layer(x)
    assert fp8_out.dtype == torch.bfloat16 and not torch.equal(fp8_out, expected)
    exact = F.linear(x.double(), ref.output_layer.weight.double())
    assert 20 < sqnr_db(exact, fp8_out) < sqnr_db(exact, expected) - 6
    assert math.isfinite(train_step(backend, model, enabled=True))


@needs_torchao
def test_torchao_refuses_what_it_cannot_run():
    from precsearch.backends.torchao_backend import TorchaoBackend

    model = nn.Sequential(nn.Linear(24, 48, bias=False)).to(DEV)
    with pytest.raises(UnsupportedRecipe, match="divisible by 16"):
        TorchaoBackend().convert(model, {"0": LayerRecipe(Precision.FP8_CURRENT)})
    with pytest.raises(UnsupportedRecipe, match="fp8_block"):
        TorchaoBackend().convert(build_model(CFG, 0, DEV), {"output_layer": LayerRecipe(Precision.FP8_BLOCK)})


@needs_torchao
def test_torchao_e4m3_format_casts_gradients_to_e4m3():
    from precsearch.backends.torchao_backend import make_config

    hybrid = make_config(LayerRecipe(Precision.FP8_CURRENT, Fp8Format.HYBRID))
    e4m3 = make_config(LayerRecipe(Precision.FP8_CURRENT, Fp8Format.E4M3))
    assert hybrid.cast_config_grad_output.target_dtype == torch.float8_e5m2
    assert e4m3.cast_config_grad_output.target_dtype == torch.float8_e4m3fn
    assert e4m3.cast_config_grad_output_for_grad_weight.target_dtype == torch.float8_e4m3fn


@needs_torchao
def test_torchao_compiled_model_trains_and_toggles():
    from precsearch.backends.torchao_backend import TorchaoBackend

    fp8 = {n: Precision.FP8_CURRENT for n in NAMES if ".mlp." in n}
    backend = TorchaoBackend(compile=True)
    model = backend.convert(build_model(CFG, 0, DEV), recipes(fp8))
    assert backend.converted_layers(model) == fp8
    losses = [train_step(backend, model, enabled=step >= 1, seed=step) for step in range(3)]
    assert all(math.isfinite(v) for v in losses)
