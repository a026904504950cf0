"""The emulated GEMM on BF16 codes (:class:`~precsearch.backends.emulated.Operand`) computes what the float32 GEMM
of the dequantized values computes.

A GPU runs the emulated layers' GEMMs on each operand's codes in BF16 with FP32 accumulation, then divides out
the per-tensor code scales (``torch.mm(..., out_dtype=float32)``); a CPU keeps float32. What would be wrong if
these failed: a scaler whose result times its code scale is not a BF16 value would lose bits in the cast, so a
GPU's emulated MXFP8/NVFP4/FP8 runs (the soak's emulated rows) would train on other numbers than a CPU's.
"""

from __future__ import annotations

import pytest
import torch

from precsearch.backends import emulated
from precsearch.backends.emulated import EmulatedFP8Linear, Operand, gemm
from precsearch.fp8.scaling import ROLES, BlockScaler, make_scaler
from precsearch.precision import LayerRecipe, Precision
from precsearch.recipes import recipe_for

EMULATED = [p for p in Precision if recipe_for(p).emulation is not None]


def _operand_like(seed: int, rows: int = 64, cols: int = 256) -> torch.Tensor:
    """Gaussian values with an outlier row and a near-zero block: tiles of very different scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x[3] *= 300.0
    x[5, :32] *= 1e-6
    return x


def _is_bf16(values: torch.Tensor) -> bool:
    """Every element equals its BF16 rounding, to float32 rounding (a relative 2**-20)."""
    rounded = values.bfloat16().float()
    return bool(((values - rounded).abs() <= 2.0**-20 * rounded.abs()).all())


@pytest.mark.parametrize("precision", EMULATED, ids=lambda p: p.value)
@pytest.mark.parametrize("role", ROLES)
def test_result_times_its_code_scale_is_bf16(precision: Precision, role: str) -> None:
    scaler = make_scaler(LayerRecipe(precision=precision), role, seed=1)
    x = _operand_like(seed=ROLES.index(role))
    for call in (scaler.quantize, scaler.quantize_columnwise, scaler.quantize):  # delayed: 2nd call, real scale
        q = call(x)
        code_scale = scaler.last_code_scale
        assert code_scale is not None and code_scale.dim() == 0
        assert _is_bf16(q * code_scale), f"{precision.value} {role}: {call.__name__}"


def test_a_block_scale_not_a_power_of_two_has_no_code_scale() -> None:
    """The check above can fail: with non-power-of-two tile scales no one factor gives BF16 values."""
    x = _operand_like(seed=7)
    scaler = BlockScaler("e4m3", (1, 128), pow2=False)
    q = scaler.quantize(x)
    assert scaler.last_code_scale is None
    assert not _is_bf16(q)
    assert _is_bf16(BlockScaler("e4m3", (1, 128), pow2=True).quantize(x))


def test_gemm_divides_out_both_code_scales() -> None:
    a, b = _operand_like(1, 32, 64), _operand_like(2, 48, 64)
    sa, sb = torch.tensor(8.0), torch.tensor(0.25)
    coded = gemm(Operand((a * sa).bfloat16(), sa), Operand((b * sb).bfloat16(), sb).t())
    plain = gemm(Operand(a.bfloat16().float()), Operand(b.bfloat16().float()).t())
    torch.testing.assert_close(coded, plain, rtol=1e-6, atol=1e-4)
    assert coded.dtype == torch.float32


def _layer_pass(precision: Precision, mode: str, monkeypatch) -> tuple[torch.Tensor, ...]:
    """Two steps of one emulated Linear (fresh scalers, the same weights and data): outputs and gradients."""
    monkeypatch.setattr(emulated, "CODE_GEMMS", mode)
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 128, bias=True)
    layer = EmulatedFP8Linear.from_linear(linear, LayerRecipe(precision=precision), seed=3)
    results = []
    for step in range(2):  # delayed scaling quantizes with the first call's amax only from the second
        x = _operand_like(10 + step, 64, 256).requires_grad_(True)
        out = layer(x)
        out.backward(_operand_like(20 + step, 64, 128))
        results += [out.detach(), x.grad, linear.weight.grad.clone(), linear.bias.grad.clone()]
        linear.weight.grad = linear.bias.grad = None
    return tuple(results)


@pytest.mark.parametrize("precision", EMULATED, ids=lambda p: p.value)
def test_layer_on_codes_matches_float32(precision: Precision, monkeypatch) -> None:
    """Forward, data and weight gradients on codes equal the float32 path up to the order of additions."""
    coded = _layer_pass(precision, "always", monkeypatch)
    plain = _layer_pass(precision, "never", monkeypatch)
    for got, want in zip(coded, plain):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5 * float(want.abs().max()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("precision", EMULATED, ids=lambda p: p.value)
def test_gpu_layer_on_bf16_codes_matches_float32(precision: Precision, monkeypatch) -> None:
    """On a GPU the codes multiply in BF16 (``out_dtype=float32``) and save BF16 for the backward."""
    monkeypatch.setattr(emulated, "CODE_GEMMS", "cuda")
    torch.manual_seed(0)
    layer = EmulatedFP8Linear.from_linear(torch.nn.Linear(256, 128).cuda(), LayerRecipe(precision=precision))
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    out = layer(x)
    assert out.grad_fn.saved_tensors[0].dtype == torch.bfloat16  # the codes path ran
    out.sum().backward()
    layer_fp32 = EmulatedFP8Linear.from_linear(torch.nn.Linear(256, 128).cuda(), LayerRecipe(precision=precision))
    layer_fp32.weight.data.copy_(layer.weight.data)
    layer_fp32.bias.data.copy_(layer.bias.data)
    monkeypatch.setattr(emulated, "CODE_GEMMS", "never")
    x2 = x.detach().clone().requires_grad_(True)
    out2 = layer_fp32(x2)
    out2.sum().backward()
    for got, want in ((out, out2), (x.grad, x2.grad), (layer.weight.grad, layer_fp32.weight.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
