"""The backend contract (:mod:`precsearch.backends.base`), one suite for every backend.

Each case is a backend on a device. On a CPU machine only ``emulated-cpu`` runs
(and ``torchao-emulate-cpu`` when torchao imports: torchao's emulation mode,
which exercises the torchao conversion logic without FP8 hardware). On a GPU
(``-m gpu``, see ``benchmarks/gpu/gpu_check.sh``) the emulated, Transformer Engine and
torchao backends run on ``cuda``; a case whose library or hardware is missing
is skipped with the reason.

Tolerances, and why:

* BF16 with FP8 switched off: emulated and torchao call ``F.linear`` on the
  same Parameters, so the logits equal the unconverted model's bit for bit.
  Transformer Engine runs its own cuBLASLt GEMM (another algorithm and
  accumulation order than torch's), so single elements may differ by a BF16
  rounding step (2**-8 relative); through two blocks and the head we allow a
  relative RMS difference of :data:`TE_BF16_RTOL`.
* FP8 layers: SQNR against a float64 reference above :data:`FP8_MIN_SQNR_DB`
  (the emulated recipes measure 25-33 dB on this layer shape) and at least
  :data:`FP8_BELOW_BF16_DB` below the same layer's BF16 SQNR (~45-51 dB), which
  proves FP8 actually ran.
* Short probe: the mean loss of a few steps within :data:`PROBE_RTOL` of the
  emulated backend's on the same device (FP8 GEMMs differ in accumulation and
  rounding details, not in recipe; torchao's emulation measured 2e-5 on CPU).

The module also unit-tests the capability tables with made-up compute
capabilities (no GPU needed).
"""

from __future__ import annotations

import copy

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from precsearch.arch.units import unit_names
from precsearch.backends.base import Backend, UnsupportedRecipe
from precsearch.backends.capability import (
    NO_GPU_TE,
    NO_GPU_TORCHAO,
    gpu_capability,
    parse_cuda_version,
    te_import_error,
    te_table,
    torchao_import_error,
    torchao_table,
)
from precsearch.backends.emulated import EmulatedBackend
from precsearch.backends.te import TEBackend, _check_delayed_keys, recipe_key
from precsearch.backends.torchao_backend import RECIPE_NAMES, TorchaoBackend
from precsearch.config.space import ProbeSection
from precsearch.fp8.scaling import ROLES
from precsearch.policy import Policy, Rule
from precsearch.precision import AmaxAlgo, LayerRecipe, Precision
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.model.llama3 import ModelConfig, build_model
from precsearch.probe.runner import run_probe

TE_BF16_RTOL = 1e-2
FP8_MIN_SQNR_DB = 20.0
FP8_BELOW_BF16_DB = 6.0
PROBE_RTOL = 0.02

CFG = ModelConfig(vocab_size=256, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=64)
NAMES = unit_names(CFG)
#: Layers given FP8 (round-robin over the case's precisions); every other Linear stays BF16.
FP8_LAYERS = (
    "decoder.layers.0.self_attention.linear_qkv",
    "decoder.layers.0.mlp.linear_fc2",
    "decoder.layers.1.self_attention.linear_proj",
    "decoder.layers.1.mlp.linear_fc1",
)
BF16_LAYERS = tuple(n for n in NAMES if n not in FP8_LAYERS)
#: Candidate FP8 precisions, in the order they are assigned.
CANDIDATES = (Precision.FP8_DELAYED, Precision.FP8_CURRENT, Precision.FP8_BLOCK, Precision.MXFP8)
BASE_RECIPE = LayerRecipe(amax_history_len=16)
SEED = 0


def _no_cuda() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA GPU"


def _torchao_gpu_skip() -> str | None:
    reason = _no_cuda() or torchao_import_error()
    if reason is None and gpu_capability("cuda") < (8, 9):
        reason = "torchao float8 needs compute capability 8.9+"
    return reason


@dataclass(frozen=True)
class Case:
    """A backend on a device, and why it cannot run here (None when it can)."""

    id: str
    device: str
    make: Callable[[], Backend]
    skip: Callable[[], str | None]
    gpu: bool = False


CASES = (
    Case("emulated-cpu", "cpu", EmulatedBackend, lambda: None),
    Case("torchao-emulate-cpu", "cpu", lambda: TorchaoBackend(emulate=True), torchao_import_error),
    Case("emulated-cuda", "cuda", EmulatedBackend, _no_cuda, gpu=True),
    Case("te-cuda", "cuda", TEBackend, lambda: _no_cuda() or te_import_error(), gpu=True),
    Case("torchao-cuda", "cuda", TorchaoBackend, _torchao_gpu_skip, gpu=True),
)


@dataclass
class Setup:
    """A backend, its device, the FP8 assignment it can run, and a reference model."""

    case: Case
    backend: Backend
    device: torch.device
    fp8: dict[str, Precision]

    def recipes(self) -> dict[str, LayerRecipe]:
        """Recipe for every Linear: FP8 per :attr:`fp8`, BF16 otherwise."""
        return {n: LayerRecipe(self.fp8.get(n, Precision.BF16), amax_history_len=16) for n in NAMES}

    def models(self, recipes: dict[str, LayerRecipe] | None = None) -> tuple[nn.Module, nn.Module]:
        """(unconverted reference, converted) models with identical initial weights."""
        ref = build_model(CFG, SEED, self.device)
        conv = self.backend.convert(build_model(CFG, SEED, self.device), recipes or self.recipes())
        return ref, conv


@pytest.fixture(params=[pytest.param(c, id=c.id, marks=[pytest.mark.gpu] if c.gpu else []) for c in CASES])
def setup(request) -> Setup:
    case: Case = request.param
    reason = case.skip()
    if reason:
        pytest.skip(f"{case.id}: {reason}")
    backend, device = case.make(), torch.device(case.device)
    table = backend.supported_precisions(device)
    runnable = [p for p in CANDIDATES if table[p] is None]
    if not runnable:
        pytest.skip(f"{case.id}: no FP8 precision runs here")
    fp8 = {n: runnable[i % len(runnable)] for i, n in enumerate(FP8_LAYERS)}
    return Setup(case, backend, device, fp8)


def bf16(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def tokens(device: torch.device, batch: int = 2, seq: int = 32, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (batch, seq), generator=gen).to(device)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    ref = ref.double()
    noise = (ref - approx.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(ref.pow(2).sum().item() / noise)


# --- conversion ------------------------------------------------------------------


def test_same_policy_converts_the_same_layers(setup: Setup):
    """A backend that converted other layers than the policy names would search another policy."""
    _, conv = setup.models()
    assert setup.backend.converted_layers(conv) == setup.fp8


def test_bf16_layers_are_untouched_and_bit_identical(setup: Setup):
    """BF16 layers must be the unconverted model's, or BF16 would not be a neutral choice.

    A backend that rebuilds the whole stack from its library's modules (TE) instead keeps BF16
    units within TE_BF16_RTOL of the unconverted model's.
    """
    ref, conv = setup.models()
    if setup.backend.rebuilds_stack:
        _bf16_units_match_within_bf16(setup, ref, conv)
        return
    x = torch.randn(4, 32, CFG.dim, generator=torch.Generator().manual_seed(2)).to(setup.device)
    for name in BF16_LAYERS:
        layer, ref_layer = conv.get_submodule(name), ref.get_submodule(name)
        assert type(layer) is type(ref_layer), name
        xin = x if layer.in_features == CFG.dim else torch.randn(4, 32, layer.in_features).to(setup.device)
        with torch.no_grad(), bf16(setup.device):
            assert torch.equal(layer(xin), ref_layer(xin)), name


def _bf16_units_match_within_bf16(setup: Setup, ref: nn.Module, conv: nn.Module) -> None:
    ids = torch.randint(0, CFG.vocab_size, (2, 32), generator=torch.Generator().manual_seed(2)).to(setup.device)
    bf16_only = {n: LayerRecipe() for n in NAMES}
    ref_all, conv_all = setup.models(bf16_only)
    with torch.no_grad(), bf16(setup.device):
        torch.testing.assert_close(conv_all(ids).float(), ref_all(ids).float(), rtol=TE_BF16_RTOL, atol=TE_BF16_RTOL)


def test_other_parameters_keep_names_values_and_order(setup: Setup):
    """Optimizer state is built after convert; the parameter order and values must not move.

    Not for a backend that rebuilds the stack (TE): its modules own new, renamed Parameters,
    which is why the probe builds the optimizer after converting.
    """
    if setup.backend.rebuilds_stack:
        pytest.skip("te rebuilds every unit from TE modules: parameters are new and renamed")
    ref, conv = setup.models()
    ref_params, conv_params = list(ref.parameters()), list(conv.parameters())
    assert len(ref_params) == len(conv_params)
    for a, b in zip(ref_params, conv_params):
        assert a.shape == b.shape and torch.equal(a.detach(), b.detach())
    converted = tuple(setup.fp8)
    ref_named = {n: p for n, p in ref.named_parameters() if not n.startswith(converted)}
    conv_named = {n: p for n, p in conv.named_parameters() if not n.startswith(converted)}
    assert ref_named.keys() == conv_named.keys()


def test_convert_keeps_weights(setup: Setup):
    """A converted layer starting from other weights would train a different model."""
    ref, conv = setup.models()
    for name in setup.fp8:
        weight = conv.get_submodule(name).weight
        assert weight.dtype == torch.float32
        assert torch.equal(weight.detach(), ref.get_submodule(name).weight.detach()), name


def test_bad_name_is_refused_before_any_change(setup: Setup):
    model = build_model(CFG, SEED, setup.device)
    recipes = setup.recipes() | {"decoder.layers.0.self_attention.core_attention": LayerRecipe(Precision.FP8_CURRENT)}
    with pytest.raises(ValueError, match="core_attention"):
        setup.backend.convert(model, recipes)
    assert setup.backend.converted_layers(model) == {}


# --- numerics --------------------------------------------------------------------


def test_fp8_off_gives_the_unconverted_model(setup: Setup):
    """The BF16 warm-up must be the unconverted model (exact; TE within TE_BF16_RTOL)."""
    ref, conv = setup.models()
    ids = tokens(setup.device)
    with torch.no_grad(), bf16(setup.device):
        expected = ref(ids)
        with setup.backend.autocast(conv, enabled=False):
            actual = conv(ids)
    assert actual.dtype == expected.dtype
    if setup.case.id.startswith("te"):
        rel = (actual.float() - expected.float()).norm() / expected.float().norm()
        assert rel < TE_BF16_RTOL
    else:
        assert torch.equal(actual, expected)


def _fp8_output(setup: Setup, conv: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """The layer's output with FP8 on, after two training passes (delayed scaling calibrates)."""
    layer = conv.get_submodule(name)
    for _ in range(2):
        xg = x.clone().requires_grad_()
        with setup.backend.autocast(conv, enabled=True), bf16(setup.device):
            out = layer(xg)
        out.float().sum().backward()
    with torch.no_grad(), setup.backend.autocast(conv, enabled=True), bf16(setup.device):
        return layer(x)


def test_fp8_layers_differ_from_bf16_within_sqnr(setup: Setup):
    """FP8 that equals BF16 did not run; FP8 far from the exact product is broken."""
    ref, conv = setup.models()
    for i, name in enumerate(setup.fp8):
        ref_layer = ref.get_submodule(name)
        gen = torch.Generator().manual_seed(10 + i)
        x = torch.randn(4, 32, ref_layer.in_features, generator=gen).to(setup.device)
        with torch.no_grad():  # float64 weights (a fused input norm computes in float32: still far above BF16)
            exact = copy.deepcopy(ref_layer).double()(x.double()).double()
        with torch.no_grad(), bf16(setup.device):
            y_bf16 = ref_layer(x)
        y_fp8 = _fp8_output(setup, conv, name, x)
        assert not torch.equal(y_fp8, y_bf16), name
        fp8_db, bf16_db = sqnr_db(exact, y_fp8), sqnr_db(exact, y_bf16)
        assert fp8_db > FP8_MIN_SQNR_DB, (name, setup.fp8[name], fp8_db)
        assert fp8_db < bf16_db - FP8_BELOW_BF16_DB, (name, setup.fp8[name], fp8_db, bf16_db)


def _policy(fp8: dict[str, Precision]) -> Policy:
    rules = tuple(Rule(name=f"r{i}", modules=(n,), precision=p) for i, (n, p) in enumerate(fp8.items()))
    return Policy(rules=rules, recipe=BASE_RECIPE, warmup_steps=2, clip_grad=1.0)


def _probe(backend: Backend, device: torch.device, policy: Policy) -> list[float]:
    probe = ProbeSection(steps=8, micro_batch=4, seq_len=32, lr=3e-3, lr_warmup_steps=2, device=device.type)
    stream = load_tokens("synthetic", max_tokens=50_000, vocab_size=CFG.vocab_size, seed=0)
    data = TokenBatches(stream, seq_len=32, micro_batch=4, seed=0, eval_batches=1)
    result = run_probe(CFG, probe, policy, data, backend, device)
    assert not result.diverged, result.reason
    assert result.fp8_steps == [False, False] + [True] * 6
    return result.losses


def test_short_probe_matches_the_emulated_backend(setup: Setup):
    """The same policy must train the same way whichever backend computes it."""
    policy = _policy(setup.fp8)
    losses = _probe(setup.backend, setup.device, policy)
    reference = _probe(EmulatedBackend(), setup.device, policy)
    assert all(math.isfinite(v) for v in losses)
    mean, ref_mean = sum(losses) / len(losses), sum(reference) / len(reference)
    assert abs(mean - ref_mean) <= PROBE_RTOL * ref_mean, (losses, reference)


def test_layer_stats_cover_every_fp8_layer_and_role(setup: Setup):
    """FP8 diagnostics: every FP8 layer and role with sane values, or ``{}`` from a backend that cannot see."""
    _, conv = setup.models()
    setup.backend.track_stats(conv, True)
    with setup.backend.autocast(conv, enabled=True), bf16(setup.device):
        loss = conv(tokens(setup.device)).float().logsumexp(-1).mean()
    loss.backward()
    stats = setup.backend.layer_stats(conv)
    if type(setup.backend).layer_stats is Backend.layer_stats:
        assert stats == {}
        return
    assert set(stats) == set(setup.fp8)
    for name, roles in stats.items():
        assert set(roles) == set(ROLES), name
        per_tensor = setup.fp8[name] in (Precision.FP8_DELAYED, Precision.FP8_CURRENT)
        for role, s in roles.items():
            assert s.amax > 0 and s.nonfinite == 0, (name, role, s)
            assert 0 <= s.overflow <= 1 and 0 <= s.underflow <= 1, (name, role, s)
            assert (s.scale is not None) == per_tensor, (name, role, s)  # block/MX scales vary per tile
    setup.backend.track_stats(conv, False)
    with setup.backend.autocast(conv, enabled=True), bf16(setup.device):
        conv(tokens(setup.device)).float().sum().backward()
    assert setup.backend.layer_stats(conv) == {}  # statistics off: nothing stale is reported


# --- refusal ---------------------------------------------------------------------


def test_unsupported_precision_is_refused_with_reason(setup: Setup):
    """A recipe the backend cannot run must be refused, never silently replaced."""
    table = setup.backend.supported_precisions(setup.device)
    assert table[Precision.BF16] is None
    refused = [p for p in Precision if table[p] is not None]
    if not refused:
        pytest.skip(f"{setup.case.id} runs every precision here")
    precision = refused[0]
    recipes = {FP8_LAYERS[0]: LayerRecipe(precision)}
    with pytest.raises(UnsupportedRecipe, match=precision.value) as info:
        setup.backend.check_supported(recipes, setup.device)
    assert table[precision] in str(info.value)
    model = build_model(CFG, SEED, setup.device)
    with pytest.raises(UnsupportedRecipe):
        setup.backend.convert(model, recipes)
    assert setup.backend.converted_layers(model) == {}


# --- capability tables (made-up GPUs, CPU only) -----------------------------------------

HOPPER, BLACKWELL, ADA = (9, 0), (10, 0), (8, 9)
FP8_ALL = [p for p in Precision if p.is_fp8]


def _runs(table: dict[Precision, str | None]) -> set[Precision]:
    return {p for p, r in table.items() if r is None}


def test_te_table_hopper():
    table = te_table(HOPPER, (13, 0))
    assert _runs(table) == {Precision.BF16, Precision.FP8_DELAYED, Precision.FP8_CURRENT, Precision.FP8_BLOCK}
    assert table[Precision.MXFP8] == "MXFP8 needs compute capability 10.0 (Blackwell); this GPU is 9.0 (Hopper)"
    assert table[Precision.NVFP4] == "NVFP4 needs compute capability 10.0 (Blackwell); this GPU is 9.0 (Hopper)"


def test_te_table_blackwell_runs_everything_te_has():
    """Everything but torchao's rowwise recipe, which TE lacks (refused with its reason on every GPU)."""
    assert _runs(te_table(BLACKWELL, (13, 0))) == set(Precision) - {Precision.FP8_ROWWISE}
    assert _runs(te_table((10, 3), (13, 0))) == set(Precision) - {Precision.FP8_ROWWISE}
    assert "no rowwise" in te_table(BLACKWELL, (13, 0))[Precision.FP8_ROWWISE]


def test_te_table_consumer_blackwell_has_no_mxfp8():
    table = te_table((12, 0), (13, 0))
    assert "MXFP8" in table[Precision.MXFP8] and "12.0" in table[Precision.MXFP8]
    assert table[Precision.NVFP4] is None


def test_te_table_ada_has_per_tensor_fp8_only():
    table = te_table(ADA, (12, 8))
    assert _runs(table) == {Precision.BF16, Precision.FP8_DELAYED, Precision.FP8_CURRENT}
    assert table[Precision.FP8_BLOCK] == (
        "FP8 block scaling needs compute capability 9.0 (Hopper); this GPU is 8.9 (Ada)"
    )


def test_te_table_cuda_versions():
    assert "CUDA 12.9" in te_table(HOPPER, (12, 8))[Precision.FP8_BLOCK]
    assert "CUDA 12.1" in te_table(ADA, (12, 0))[Precision.FP8_CURRENT]
    assert te_table(HOPPER, None)[Precision.FP8_BLOCK] is None  # unknown CUDA: not checked


@pytest.mark.parametrize("cap", [(8, 0), (8, 6), (7, 5)])
def test_te_table_before_ada_runs_no_fp8(cap):
    table = te_table(cap, (13, 0))
    assert _runs(table) == {Precision.BF16}
    assert table[Precision.FP8_CURRENT].startswith("FP8 current scaling needs compute capability 8.9 (Ada)")


def test_te_table_without_gpu():
    assert te_table(None) == {p: (None if p is Precision.BF16 else NO_GPU_TE) for p in Precision}


def test_torchao_table():
    assert _runs(torchao_table(HOPPER)) == {Precision.BF16, Precision.FP8_CURRENT, Precision.FP8_ROWWISE}
    assert set(RECIPE_NAMES) == {Precision.FP8_CURRENT, Precision.FP8_ROWWISE}
    assert "9.0" in torchao_table(ADA)[Precision.FP8_ROWWISE]  # the rowwise-scaled GEMM needs Hopper
    assert "8.9" in torchao_table((8, 0))[Precision.FP8_CURRENT]
    assert torchao_table(None)[Precision.FP8_CURRENT] == NO_GPU_TORCHAO
    assert "delayed" in torchao_table(HOPPER)[Precision.FP8_DELAYED]


def test_parse_cuda_version():
    assert parse_cuda_version("13.0") == (13, 0)
    assert parse_cuda_version("12.9.1") == (12, 9)
    assert parse_cuda_version(None) is None and parse_cuda_version("x") is None


def test_gpu_backends_refuse_fp8_on_cpu_without_importing():
    """On a CPU the GPU backends must say why, before touching their libraries."""
    assert gpu_capability("cpu") is None
    cpu = torch.device("cpu")
    assert TEBackend().supported_precisions(cpu) == te_table(None)
    with pytest.raises(UnsupportedRecipe, match="Transformer Engine needs a CUDA GPU"):
        TEBackend().convert(build_model(CFG, SEED), {FP8_LAYERS[0]: LayerRecipe(Precision.FP8_CURRENT)})
    table = TorchaoBackend().supported_precisions(cpu)
    assert table[Precision.FP8_CURRENT] in (NO_GPU_TORCHAO, torchao_import_error())


def test_te_recipe_key_and_delayed_groups():
    """Layers sharing a TE recipe object share its fields; TE cannot keep two algorithms apart."""
    a = LayerRecipe(Precision.FP8_CURRENT, amax_history_len=4)
    b = LayerRecipe(Precision.FP8_CURRENT, amax_history_len=8)
    assert recipe_key(a) == recipe_key(b)  # history is a delayed-scaling field
    d_max = LayerRecipe(Precision.FP8_DELAYED, amax_compute_algo=AmaxAlgo.MAX)
    d_recent = LayerRecipe(Precision.FP8_DELAYED, amax_compute_algo=AmaxAlgo.MOST_RECENT)
    assert recipe_key(d_max) != recipe_key(d_recent)
    nvfp4 = LayerRecipe(Precision.NVFP4)
    assert recipe_key(nvfp4) != recipe_key(LayerRecipe(Precision.NVFP4, nvfp4_rht=False))  # its own TE object
    _check_delayed_keys({"a": d_max, "b": d_max, "c": a})
    with pytest.raises(UnsupportedRecipe, match="amax_compute_algo"):
        _check_delayed_keys({"a": d_max, "b": d_recent})
