"""The CPU's fast FP8 round trip (a code table, no infinity pass when the amax is finite,
tile scales broadcast) changes no bit.

:func:`~precsearch.fp8.formats.quantize_dequantize` reads FP8 codes back through a
256-entry table and skips putting infinities back when the tensor's amax says there
are none; block recipes broadcast each tile's scale (:func:`~precsearch.fp8.scaling.quantize_blocks`)
and reduce tile maxima one dim at a time (:func:`~precsearch.fp8.scaling.block_amax`).
These tests hold them to the plain formulas (``where(isinf(x), x, cast(clamp(x * s)).float() / s)``
with the scales spread over the tensor), bit for bit (NaN payloads and the sign of zero
included) and stride for stride (a GEMM's kernel, and so its rounding, can depend on
its operands' layout). If they fail, an emulated-FP8 probe no longer trains as it did:
its losses, gradients and scales would drift from earlier studies' for no reason of numerics.
"""

from __future__ import annotations

import pytest
import torch

from precsearch.backends.emulated import EmulatedBackend, EmulatedFP8Linear
from precsearch.config.space import ProbeSection
from precsearch.fp8 import scaling
from precsearch.fp8.formats import fp8_dtype, fp8_max, quantize_dequantize
from precsearch.policy import Policy
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe import runner
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.measure.diagnostics import DiagnosticsConfig
from precsearch.probe.model.llama3 import ModelConfig

INF, NAN = float("inf"), float("nan")
PER_TENSOR_AND_BLOCK = (Precision.FP8_CURRENT, Precision.FP8_DELAYED, Precision.FP8_BLOCK, Precision.MXFP8)


def reference_qdq(x: torch.Tensor, scale, fmt: str, amax=None) -> torch.Tensor:
    """The round trip as first written: FP8 cast and back, then the infinities put back."""
    x32 = x.float()
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    out = (x32 * scale).clamp(-fp8_max(fmt), fp8_max(fmt)).to(fp8_dtype(fmt)).float() / scale
    return torch.where(torch.isinf(x32), x32, out)


def reference_block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Tile maxima as first written: one reduction over both dims of each tile."""
    br, bc = block
    a = x.detach().float().abs()
    a = a if a.dim() >= 2 else a.unsqueeze(0)
    a = torch.nn.functional.pad(a, (0, -a.shape[-1] % bc, 0, -a.shape[-2] % br))
    return a.unflatten(-1, (-1, bc)).unflatten(-3, (-1, br)).amax(dim=(-3, -1))


def reference_blocks(x, scale, block, fmt, amax=None):
    return reference_qdq(x, scaling.expand_blocks(scale, block, x.shape), fmt)


def use_reference(monkeypatch) -> None:
    monkeypatch.setattr(scaling, "quantize_dequantize", reference_qdq)
    monkeypatch.setattr(scaling, "quantize_blocks", reference_blocks)
    monkeypatch.setattr(scaling, "block_amax", reference_block_amax)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape and a.stride() == b.stride()
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def _operand(dtype: torch.dtype, special: bool) -> torch.Tensor:
    """Gaussian values over a wide range, with (if ``special``) NaN, +-inf, +-0 and huge and tiny values."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 384, generator=gen) * torch.logspace(-12, 6, 384)
    if special:
        x[0, :8] = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 3e38, -1e-40, 1e-30])
    return x.to(dtype)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_per_tensor_round_trip_is_the_plain_cast(fmt, dtype, special, transposed):
    """Every code read back through the table, with the scale folded in, is the cast's value."""
    x = _operand(dtype, special)
    x = x.t() if transposed else x
    for scale in (1.0, 448 / 3.7, 2.0**-20, 1e30, torch.finfo(torch.float32).max):
        s = torch.tensor(scale)
        amax = x.float().abs().amax()
        assert_same_bits(quantize_dequantize(x, s, fmt), reference_qdq(x, s, fmt))
        assert_same_bits(quantize_dequantize(x, s, fmt, amax), reference_qdq(x, s, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("transposed", [False, True])
def test_block_round_trip_is_the_plain_cast(fmt, transposed):
    """With one scale per element (block recipes) the table gives the codes and the division stays."""
    x = _operand(torch.float32, special=True)
    x = x.t() if transposed else x
    scale = torch.logspace(-8, 8, x.numel()).reshape(x.shape)
    assert_same_bits(quantize_dequantize(x, scale, fmt), reference_qdq(x, scale, fmt))


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (1, 32), (16, 16)])
@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (256, 100)])
@pytest.mark.parametrize("transposed", [False, True])
def test_tile_scales_broadcast_as_spread(block, shape, transposed):
    """Tile maxima and each tile's scale over its tile, divisible or ragged, row- or column-major."""
    x = _operand(torch.bfloat16, special=True)[: shape[0], : shape[1]].contiguous()
    x = x.t() if transposed else x
    amax = scaling.block_amax(x, block)
    assert_same_bits(amax, reference_block_amax(x, block))
    scale = torch.rand(amax.shape, generator=torch.Generator().manual_seed(1)) * 100
    for fmt in ("e4m3", "e5m2"):
        assert_same_bits(scaling.quantize_blocks(x, scale, block, fmt, amax), reference_blocks(x, scale, block, fmt))


def test_every_code_of_both_formats_reads_back_as_the_cast():
    """The table itself: each of the 256 codes, NaNs and infinities included, as ``.float()`` gives it."""
    for fmt in ("e4m3", "e5m2"):
        codes = torch.arange(256, dtype=torch.uint8).view(fp8_dtype(fmt))
        values = codes.float()  # every code, as the scaled value to quantize with scale 1
        finite = torch.isfinite(values)
        x = values[finite]
        assert_same_bits(quantize_dequantize(x, torch.tensor(1.0), fmt), reference_qdq(x, torch.tensor(1.0), fmt))


def _layer_run(precision: Precision, fp8_format: str, steps: int = 3) -> list[torch.Tensor]:
    """Outputs, gradients, scales and statistics of ``steps`` forward/backward passes of one layer."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 384, bias=True)
    recipe = LayerRecipe(precision, fp8_format, amax_history_len=4)
    layer = EmulatedFP8Linear.from_linear(linear, recipe)
    layer.track_stats(True)
    seen = []
    for step in range(steps):
        x = (torch.randn(2, 64, 256) * (1 + 3 * step)).bfloat16().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)
        out.float().pow(2).mean().backward()
        seen += [out, x.grad, linear.weight.grad, linear.bias.grad]
        for role in scaling.ROLES:
            scaler = getattr(layer, f"{role}_scaler")
            seen += [scaler.last_scale, *scaler.last_stats.values()]
            if isinstance(scaler, scaling.DelayedScaler):
                seen += [scaler.scale, scaler.amax_history]
        linear.weight.grad = linear.bias.grad = None
    return seen


@pytest.mark.parametrize("precision", PER_TENSOR_AND_BLOCK)
@pytest.mark.parametrize("fp8_format", ["hybrid", "e4m3"])
def test_emulated_layer_is_unchanged(monkeypatch, precision, fp8_format):
    """An emulated FP8 Linear's outputs, gradients, scaler state and statistics are those of the plain cast."""
    fast = _layer_run(precision, fp8_format)
    use_reference(monkeypatch)
    reference = _layer_run(precision, fp8_format)
    assert len(fast) == len(reference)
    for a, b in zip(fast, reference):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b) or (a.isnan().any() and torch.equal(a.isnan(), b.isnan()))


CFG = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
DATA = TokenBatches(synthetic_tokens(20_000, CFG.vocab_size, 0), seq_len=16, micro_batch=2, seed=0, eval_batches=1)


def _probe_run(precision: Precision) -> tuple:
    probe = ProbeSection(steps=6, micro_batch=2, seq_len=16, lr=3e-3, seed=0, device="cpu", lr_warmup_steps=1)
    policy = Policy(default=precision, recipe=LayerRecipe(amax_history_len=4))
    r = runner.run_probe(CFG, probe, policy, DATA, EmulatedBackend(), torch.device("cpu"),
                         diagnostics=DiagnosticsConfig(every=2))
    return r.losses, r.grad_norms, r.eval_loss, r.layer_stats


@pytest.mark.parametrize("precision", [Precision.FP8_CURRENT, Precision.FP8_DELAYED, Precision.FP8_BLOCK])
def test_probe_trains_as_with_the_plain_cast(monkeypatch, precision):
    """A probe's losses, gradient norms, held-out loss and per-layer statistics, to the bit."""
    fast = _probe_run(precision)
    use_reference(monkeypatch)
    assert fast == _probe_run(precision)
