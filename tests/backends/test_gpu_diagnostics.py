"""GPU-only checks of the FP8 diagnostics on Transformer Engine (run by benchmarks/gpu/gpu_check.sh).

They prove what the CPU cannot: that the ``te`` backend's statistics use the
scale TE casts with and see the amax TE records (delayed scaling), that TE's
debug API is out of reach without nvdlfw-inspect (why hooks are used), that
the first-bad-layer diagnosis works through TE layers, and that TE shows the
same stale-weight-scale saturation as the emulated backend.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from precsearch.arch.units import unit_names
from precsearch.backends.capability import te_import_error
from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.measure.diagnostics import DiagnosticsConfig
from precsearch.probe.model.llama3 import ModelConfig, build_model
from precsearch.probe.runner import run_probe

CUDA = torch.cuda.is_available()
_TE_ERROR = te_import_error() if CUDA else "no CUDA GPU"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_TE_ERROR is not None, reason=str(_TE_ERROR))]

DEV = torch.device("cuda")
CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
NAMES = unit_names(CFG)
TARGET = "decoder.layers.1.self_attention.linear_qkv"


def ids(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (4, 32), generator=gen).to(DEV)


def step(backend, model, seed: int) -> None:
    tok = ids(seed)
    with backend.autocast(model, enabled=True), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(tok, tok)
    loss.backward()


def hot_probe(steps: int) -> tuple[ProbeSection, TokenBatches, Policy]:
    probe = ProbeSection(steps=steps, micro_batch=4, seq_len=32, lr=0.3, schedule="constant", lr_warmup_steps=0,
                         device="cuda")
    data = TokenBatches(load_tokens("stdlib", max_tokens=100_000, vocab_size=256, seed=0),
                        seq_len=32, micro_batch=4, seed=0, eval_batches=1)
    recipe = LayerRecipe(amax_history_len=1, amax_compute_algo="most_recent")
    rules = (Rule(name="all", modules=("*",), precision=Precision.FP8_DELAYED),)
    return probe, data, Policy(rules=rules, recipe=recipe, warmup_steps=0, clip_grad=None)


def test_te_debug_api_needs_nvdlfw_inspect():
    """Why the te backend hooks tensors: TE's LogFp8TensorStats feature does not import without nvdlfw-inspect."""
    if importlib.util.find_spec("nvdlfw_inspect") is not None:
        pytest.skip("nvdlfw-inspect is installed here: TE's debug API could be used")
    with pytest.raises(ImportError, match="nvdlfw_inspect"):
        importlib.import_module("transformer_engine.debug.features.log_fp8_tensor_stats")


def test_te_delayed_stats_use_te_scale_and_see_te_amax():
    """The scale must be the one TE cast with (before its update), the amax the one TE recorded."""
    from precsearch.backends.te import TEBackend

    backend = TEBackend()
    recipes = {n: LayerRecipe(Precision.FP8_DELAYED, amax_history_len=8) for n in (NAMES[0], "output_layer")}
    model = backend.convert(build_model(CFG, 0, DEV), recipes)
    backend.track_stats(model, True)
    step(backend, model, 0)
    first, meta = backend.layer_stats(model), backend.fp8_metadata(model)
    for name in recipes:
        for role in ("input", "weight", "grad_output"):
            s = first[name][role]
            assert s.scale == 1.0, (name, role, s)  # TE's initial delayed scale
            te_amax = float(meta[name]["amax_history"][role][-1])  # the newest entry, rolled to the end
            # the hook reads the tensor TE is handed after autocast (BF16), TE takes its amax in fp32 as it
            # casts: they agree to BF16 precision (2^-8), not exactly (seen on the H200: 3.65625 vs 3.65679)
            assert s.amax == pytest.approx(te_amax, rel=2**-8), (name, role, s.amax, te_amax)
    backend.track_stats(model, True)
    step(backend, model, 1)
    second = backend.layer_stats(model)
    for name in recipes:
        for role in ("input", "weight", "grad_output"):
            te_scale = float(meta[name]["scale"][role])  # TE's scale after step 0 = the one step 1 used
            assert te_scale != 1.0 and second[name][role].scale == pytest.approx(te_scale, rel=1e-6), (name, role)


@pytest.mark.parametrize("precision", [Precision.FP8_CURRENT, Precision.FP8_BLOCK])
def test_te_current_and_block_stats_fit_each_tensor(precision):
    """Scales recomputed per tensor never saturate; a per-tensor scale maps amax onto the format max."""
    from precsearch.backends.te import TEBackend

    backend = TEBackend()
    if backend.supported_precisions(DEV)[precision] is not None:
        pytest.skip(backend.supported_precisions(DEV)[precision])
    model = backend.convert(build_model(CFG, 0, DEV), {n: LayerRecipe(precision) for n in NAMES})
    backend.track_stats(model, True)
    step(backend, model, 0)
    stats = backend.layer_stats(model)
    assert set(stats) == set(NAMES)
    for name, roles in stats.items():
        for role, s in roles.items():
            assert s.overflow == 0 and s.nonfinite == 0, (name, role, s)
            if precision is Precision.FP8_CURRENT:
                fmax = 57344.0 if role == "grad_output" else 448.0  # HYBRID: E5M2 gradients
                assert s.scale == pytest.approx(fmax / s.amax, rel=1e-6), (name, role, s)


def test_te_first_nonfinite_output_is_named():
    """A TE layer whose output turns non-finite must be named, not the layers the NaN spreads to."""
    from precsearch.backends.te import TEBackend

    class Faulty(TEBackend):
        def convert(self, model, recipes):
            model = super().convert(model, recipes)
            calls = [0]

            def poison(_m, _args, out):
                calls[0] += 1
                if calls[0] >= 3:  # from step 2 on (the diverged step's replay meets it again)
                    out = out.clone()
                    out.view(-1)[3] = math.nan
                    return out
                return None

            model.get_submodule(TARGET).register_forward_hook(poison)  # before the probe's own hooks
            return model

    probe, data, policy = hot_probe(steps=5)
    result = run_probe(CFG, probe.model_copy(update={"lr": 3e-3}), policy, data, Faulty(), DEV)
    assert result.diverged and result.diverged_step == 2, result.reason
    bad = result.first_bad
    assert (bad["step"], bad["layer"], bad["tensor"], bad["kind"]) == (2, TARGET, "output", "nonfinite"), bad
    assert f"first bad layer {TARGET}" in result.reason


def test_te_shows_the_stale_weight_scale_like_the_emulated_backend():
    """After Adam's first hot update, delayed-scaled weights saturate at step 1 on TE as in the emulation."""
    from precsearch.backends.te import TEBackend

    probe, data, policy = hot_probe(steps=3)
    every = DiagnosticsConfig(every=1)
    te = run_probe(CFG, probe, policy, data, TEBackend(), DEV, diagnostics=every)
    emulated = run_probe(CFG, probe, policy, data, EmulatedBackend(), DEV, diagnostics=every)

    def weights(result, at_step: int) -> dict[str, float]:
        return {r["layer"]: r["overflow"] for r in result.layer_stats if r["step"] == at_step and r["role"] == "weight"}

    assert max(weights(te, 0).values()) <= 0.001  # the scale was fitted to these very weights
    te_1, emulated_1 = weights(te, 1), weights(emulated, 1)
    assert set(te_1) == set(NAMES)
    for name in NAMES:
        assert te_1[name] > 0.5 and abs(te_1[name] - emulated_1[name]) < 0.05, (name, te_1[name], emulated_1[name])
