"""BF16 Linear layers on a CPU: float32 GEMMs, BF16 values, the same training curve as native BF16 GEMMs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from precsearch import cpu_bf16
from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe import runner
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig

aten = torch.ops.aten
GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, max_seq_len=64)
CPU = torch.device("cpu")
#: One BF16 ulp relative to the value (7 stored mantissa bits): two roundings of nearly equal
#: float32 sums differ by at most this.
BF16_ULP = 2.0 ** -7


@pytest.fixture
def float32_gemms(monkeypatch):
    """The path of a CPU without BF16 dot products, whatever this CPU has."""
    monkeypatch.setattr(cpu_bf16, "native_bf16_gemms", lambda: False)


class _GemmDtypes(TorchDispatchMode):
    """Records the operand dtypes of every GEMM dispatched while it is active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.seen: list[set[torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in GEMMS:
            self.seen.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
        return func(*args, **(kwargs or {}))


def _data(steps: int) -> TokenBatches:
    return TokenBatches(synthetic_tokens(40_000, CFG.vocab_size, seed=0), seq_len=32, micro_batch=4, seed=0,
                        eval_batches=2)


def _policy(fp8: bool) -> Policy:
    if not fp8:
        return Policy.bf16()
    rule = Rule("mlp", ("*.mlp.*",), Precision.FP8_CURRENT)
    return Policy(rules=(rule,), recipe=LayerRecipe(), warmup_steps=1)


@pytest.mark.parametrize("fp8_on", [False, True])
def test_probe_step_on_cpu_runs_no_bf16_gemm(float32_gemms, fp8_on: bool):
    # the slow path on CPUs without BF16 dot products: a BF16 GEMM anywhere in a step, forward or
    # backward, of the BF16 layers or of FP8 layers during their BF16 warm-up (fp8_on False)
    backend = EmulatedBackend()
    model = runner.build_probe(CFG, _policy(fp8=True), backend, CPU, seed=0)
    with _GemmDtypes() as mode:
        runner._forward_backward(model, _data(1), 0, fp8_on, backend, CPU)
    assert len(mode.seen) >= 3 * (2 * 4 + 1), "every Linear's forward, dgrad and wgrad GEMM is seen"
    assert all(dtypes == {torch.float32} for dtypes in mode.seen), mode.seen


def test_linear_matches_autocast_bf16_linear_within_one_ulp(float32_gemms):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 17, 96, generator=gen, requires_grad=True)
    w = torch.randn(40, 96, generator=gen, requires_grad=True)
    b = torch.randn(40, generator=gen, requires_grad=True)
    grad = torch.randn(3, 17, 40, generator=gen).bfloat16()
    results = []
    for fn in (F.linear, cpu_bf16.linear):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(x, w, b)
        out.backward(grad)
        results.append((out, x.grad, w.grad, b.grad))
        x.grad = w.grad = b.grad = None
    for native, ours, name in zip(*results, ("output", "input grad", "weight grad", "bias grad")):
        assert ours.dtype == native.dtype, name
        # native BF16 GEMMs and float32 GEMMs of BF16 operands differ only in the order of float32 sums
        torch.testing.assert_close(ours.float(), native.float(), rtol=BF16_ULP, atol=1e-6, msg=name)
    exact = (x.detach().bfloat16().double() @ w.detach().bfloat16().double().t() + b.detach().bfloat16().double())
    torch.testing.assert_close(results[1][0].double(), exact, rtol=2.0 ** -8, atol=1e-6)


def test_linear_outside_cpu_bf16_autocast_is_f_linear(float32_gemms):
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    assert torch.equal(cpu_bf16.linear(x, w), F.linear(x, w))
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.equal(cpu_bf16.linear(x, w), F.linear(x, w))


def test_cpu_with_native_bf16_keeps_autocasts_gemm(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16_gemms", lambda: True)
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16), _GemmDtypes() as mode:
        out = cpu_bf16.linear(x, w)
    assert mode.seen == [{torch.bfloat16}] and cpu_bf16.gemm_path() == "native-bf16"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(out, F.linear(x, w))


def test_reference_key_names_the_gemm_path(monkeypatch):
    # a reference computed with native BF16 GEMMs is not reused where float32 ones run, nor back
    from precsearch.config.loader import parse_space
    from precsearch.runtime.reference import reference_key
    from _spaces import tiny_space_dict

    space = parse_space(tiny_space_dict())
    keys = set()
    for native in (True, False):
        monkeypatch.setattr(cpu_bf16, "native_bf16_gemms", lambda native=native: native)
        keys.add(reference_key(space, None, CPU))
    assert len(keys) == 2


@pytest.mark.parametrize("fp8", [False, True])
def test_probe_loss_curve_matches_native_bf16_gemms(float32_gemms, monkeypatch, fp8: bool):
    # what the BF16 reference (fp8 False) and a trial's BF16 layers used to compute, with native
    # BF16 GEMMs: the losses of a few steps agree to BF16 rounding of the loss
    probe = ProbeSection(steps=6, micro_batch=4, seq_len=32, lr=3e-3, lr_warmup_steps=2)
    data = _data(probe.steps)

    def losses() -> list[float]:
        result = runner.run_probe(CFG, probe, _policy(fp8), data, EmulatedBackend(), CPU)
        return result.losses + [result.eval_loss]

    ours = losses()
    monkeypatch.setattr(cpu_bf16, "linear", F.linear)
    native = losses()
    assert ours != native, "the two paths are different code"
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(native), rtol=2.0 ** -8, atol=0)
