"""The emulated FP8 backend: FP8 numerics in plain PyTorch, on any device.

Each converted Linear quantize-dequantizes its GEMM operands with the scalers of
its recipe (:mod:`precsearch.fp8.scaling`) and multiplies with FP32 accumulation,
which is what an FP8 tensor-core GEMM computes. On a CPU the GEMM runs in float32
on the dequantized values. On a GPU it runs as the tensor core does: each operand's
codes (times any power-of-two block scales) are BF16 values, so the GEMM takes them
in BF16, accumulates in FP32, and divides out the two per-tensor scales once
(:class:`Operand`); the products are the same, only the order of the additions
differs. It is slower than Transformer Engine but runs everywhere and exposes the
numerics (saturation, underflow, stale delayed scales) for tests and diagnostics.

As in Transformer Engine, block-scaled operands are quantized along the
dimension their GEMM reduces over: the forward and dgrad GEMMs see row-wise
tiles, the wgrad GEMM (which reduces over tokens) sees the input and the
gradient quantized with column-wise tiles. Per-tensor scales and square tiles
give the same values either way and are quantized once.

NVFP4 follows Transformer Engine's ``NVFP4BlockScaling`` with each piece
switchable by the recipe (:mod:`precsearch.fp8.nvfp4`): 16x16 weight tiles (one
quantized weight for forward and dgrad), the random Hadamard transform of the
wgrad GEMM's two operands along the token dim (their product is unchanged up to
quantization), and stochastic rounding of the output gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from precsearch import cpu_bf16
from precsearch.backends.base import Backend, keep_input_norm, linear_modules, model_device, norm_input
from precsearch.fp8.scaling import Scaler, make_scaler
from precsearch.precision import LayerRecipe, Precision
from precsearch.backends.support import EmulatedSupport
from precsearch.backends.tensor_stats import TensorStats


CODE_GEMMS = "cuda"
"""Where the emulated GEMMs run on BF16 codes (:class:`Operand`): ``"cuda"`` (on a GPU), ``"always"`` (a CPU too,
in float32 on the codes: tests) or ``"never"`` (float32 on the dequantized values everywhere, as a CPU runs them;
``bench_emulated_gemm.py@6f05340`` times the two on a GPU)."""


class Operand(NamedTuple):
    """One quantized GEMM operand: ``values / code_scale`` is the quantize-dequantized tensor.

    With a code scale, ``values`` is BF16 (the codes, times power-of-two block scales: exact in BF16); without one,
    ``values`` is the float32 dequantized tensor itself.
    """

    values: Tensor
    code_scale: Tensor | None = None

    def t(self) -> "Operand":
        return Operand(self.values.t(), self.code_scale)

    def dequantized(self) -> Tensor:
        """The float32 quantize-dequantized tensor."""
        return self.values if self.code_scale is None else self.values.float() / self.code_scale


def _operand(q: Tensor, code_scale: Tensor | None) -> Operand:
    """``q`` (quantize-dequantized, float32) as the GEMM will take it: BF16 codes on a GPU, else ``q``."""
    if code_scale is None or CODE_GEMMS == "never" or (CODE_GEMMS == "cuda" and not _mm_into_float32(q.device)):
        return Operand(q)
    return Operand((q * code_scale).to(torch.bfloat16), code_scale)


@functools.cache
def _mm_into_float32(device: torch.device) -> bool:
    """Whether this device multiplies BF16 matrices into float32 (``torch.mm``'s ``out_dtype``: CUDA, torch >= 2.8)."""
    if device.type != "cuda":
        return False
    try:
        ones = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        return torch.mm(ones, ones, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def gemm(a: Operand, b: Operand) -> Tensor:
    """``a @ b`` in float32 with FP32 accumulation.

    Two BF16-code operands multiply in BF16 into float32 (``torch.mm(..., out_dtype=float32)``), then both code
    scales are divided out, as an FP8 GEMM applies its scales to the accumulator; otherwise float32 operands.
    """
    if a.code_scale is None or b.code_scale is None:
        return a.dequantized() @ b.dequantized()
    if a.values.is_cuda:
        acc = torch.mm(a.values, b.values, out_dtype=torch.float32)
    else:  # no BF16 -> float32 GEMM on a CPU: the same products, in float32
        acc = a.values.float() @ b.values.float()
    return acc / a.code_scale / b.code_scale


def _code_scale(scaler: Scaler) -> Tensor | None:
    """The scaler's latest code scale; None (float32 GEMMs) for a stand-in that keeps none (tests plant some)."""
    return getattr(scaler, "last_code_scale", None)


def _transpose_invariant(scaler: Scaler) -> bool:
    """True when quantizing a 2-d tensor's transpose gives the transposed values."""
    block = getattr(scaler, "block", None)
    return not scaler.blockwise or block is None or block[0] == block[1]


def _quantize(
    scaler: Scaler, t2d: Tensor, columnwise: bool
) -> tuple[Operand, Operand | None, dict[str, Tensor] | None]:
    """Row-wise (and, if asked, column-wise) quantization of a 2-d GEMM operand.

    Returns:
        (row-wise operand, column-wise operand or None, stats of the row-wise call).
    """
    row = _operand(scaler.quantize(t2d), _code_scale(scaler))
    stats = scaler.last_stats
    if not columnwise:
        return row, None, stats
    # a column-wise pass of a delayed scaler would record its amax twice: reuse
    if _transpose_invariant(scaler):
        return row, row, stats
    return row, _operand(scaler.quantize_columnwise(t2d), _code_scale(scaler)), stats


def _forward_operands(
    layer: "EmulatedFP8Linear", x2d: Tensor, weight: Tensor, need_dgrad: bool, need_wgrad: bool
) -> tuple[Operand, Operand, Operand | None, Operand | None]:
    """Quantized (x, w) for the forward GEMM, and x for wgrad and w for dgrad if needed.

    The dgrad GEMM reduces over out_features, so its weight is quantized with
    tiles running down the weight's columns; the wgrad GEMM reduces over tokens.
    """
    qx, qx_col, x_stats = _quantize(layer.input_scaler, x2d, need_wgrad)
    qw, qw_dgrad, w_stats = _quantize(layer.weight_scaler, weight, need_dgrad)
    layer.last_stats.update(input=x_stats, weight=w_stats)
    layer.last_numel.update(input=x2d.numel(), weight=weight.numel())
    return qx, qw, qx_col, qw_dgrad


class _Fp8LinearFunction(torch.autograd.Function):
    """y = q(x) @ q(w)^T + b with FP32 accumulation; backward quantizes the incoming gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        layer: "EmulatedFP8Linear",
        out_dtype: torch.dtype,
    ) -> Tensor:
        qx, qw, qx_col, qw_dgrad = _forward_operands(
            layer, x.reshape(-1, x.shape[-1]), weight, *ctx.needs_input_grad[:2]
        )
        out = gemm(qx, qw.t())  # float32 accumulation, as an FP8 GEMM does
        if bias is not None:
            out = out + bias.float()
        ctx.save_for_backward(*(op.values if op is not None else None for op in (qx_col, qw_dgrad)))
        ctx.code_scales = tuple(op.code_scale if op is not None else None for op in (qx_col, qw_dgrad))
        ctx.layer, ctx.has_bias = layer, bias is not None
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.b_dtype = bias.dtype if bias is not None else None
        return out.to(out_dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        qx_col, qw_dgrad = (v if v is None else Operand(v, c) for v, c in zip(ctx.saved_tensors, ctx.code_scales))
        layer: EmulatedFP8Linear = ctx.layer
        need_dgrad, need_wgrad, need_bgrad = ctx.needs_input_grad[:3]
        # backward may run inside an autocast region; keep the GEMMs in float32
        with torch.autocast(grad_out.device.type, enabled=False):
            g = grad_out.reshape(-1, grad_out.shape[-1]).float()
            qg, qg_col, g_stats = _quantize(layer.grad_output_scaler, g, need_wgrad)
            layer.last_stats["grad_output"] = g_stats
            layer.last_numel["grad_output"] = g.numel()
            dx = dw = db = None
            if need_dgrad:
                dx = gemm(qg, qw_dgrad).reshape(ctx.x_shape).to(ctx.x_dtype)
            if need_wgrad:
                dw = gemm(qg_col.t(), qx_col).to(ctx.w_dtype)
            if need_bgrad and ctx.has_bias:
                # the bias gradient is a reduction of the unquantized gradient (TE does the same)
                db = g.sum(0).to(ctx.b_dtype)
        return dx, dw, db, None, None


class EmulatedFP8Linear(nn.Module):
    """A Linear layer whose GEMMs run through emulated FP8 quantization.

    Attributes:
        weight: The original layer's weight Parameter (the same object).
        bias: The original layer's bias Parameter, or None.
        layer_norm_weight: The RMSNorm fused into the original's input (same Parameter), or None.
        recipe: The layer's numeric recipe.
        fp8_enabled: When False the layer is exactly :func:`precsearch.cpu_bf16.linear`.
        input_scaler, weight_scaler, grad_output_scaler: One scaler per role.
        last_stats: Role -> diagnostics of the latest forward/backward: ``amax``,
            ``saturated_frac``, ``underflow_frac``, ``nonfinite_frac`` and, for
            per-tensor recipes, ``scale`` (all 0-d tensors); None for a role
            quantized while :meth:`track_stats` was off.
        last_numel: Role -> element count of the latest operand of that role.
    """

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, recipe: LayerRecipe, seed: int = 0):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = bias
        self.recipe = recipe
        self.seed = seed  # this layer's own stochastic-rounding stream (NVFP4 gradients)
        self.reset_state()
        self.register_parameter("layer_norm_weight", None)

    def reset_state(self) -> None:
        """FP8 on, fresh scalers (no amax history, rounding streams from their start), no statistics:
        the layer's state when it was made, its Parameters untouched."""
        self.fp8_enabled = True
        self.input_scaler = make_scaler(self.recipe, "input", self.seed)
        self.weight_scaler = make_scaler(self.recipe, "weight", self.seed)
        self.grad_output_scaler = make_scaler(self.recipe, "grad_output", self.seed)
        self.last_stats: dict[str, dict[str, Tensor] | None] = {}
        self.last_numel: dict[str, int] = {}

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: LayerRecipe, seed: int = 0) -> "EmulatedFP8Linear":
        """Wrap ``linear``'s own Parameters (not copies) so optimizers see the same ones."""
        layer = cls(linear.weight, linear.bias, recipe, seed)
        keep_input_norm(layer, linear)
        layer.train(linear.training)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        """``norm(x) @ weight.T + bias``, through FP8 quantization when enabled."""
        x = norm_input(self, x)
        if not self.fp8_enabled:  # as the unconverted probe's Linear computes
            return cpu_bf16.linear(x, self.weight, self.bias)
        device_type = x.device.type
        # match what nn.Linear returns: the autocast dtype inside autocast, else x's dtype
        if torch.is_autocast_enabled(device_type):
            out_dtype = torch.get_autocast_dtype(device_type)
        else:
            out_dtype = x.dtype
        with torch.autocast(device_type, enabled=False):
            return _Fp8LinearFunction.apply(x, self.weight, self.bias, self, out_dtype)

    def track_stats(self, enabled: bool) -> None:
        """Compute ``last_stats`` in the following passes, or stop (they cost extra tensor passes).

        Either way the statistics of earlier passes are dropped, so what
        :meth:`layer_stats` reports always comes from passes made since.
        """
        for scaler in (self.input_scaler, self.weight_scaler, self.grad_output_scaler):
            scaler.track_stats = enabled
            scaler.last_stats = None
        self.last_stats, self.last_numel = {}, {}

    def layer_stats(self) -> dict[str, TensorStats]:
        """Role -> :class:`TensorStats` for each role quantized, with statistics on, since the last toggle."""
        return {
            role: TensorStats.from_quantization(stats, self.last_numel[role])
            for role, stats in self.last_stats.items()
            if stats is not None
        }

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, precision={self.recipe.precision.value}, "
            f"fp8_format={self.recipe.fp8_format.value}"
        )


class EmulatedBackend(EmulatedSupport, Backend):
    """Emulated FP8 (delayed, current, block, MXFP8) and NVFP4 on any device, in plain PyTorch.

    Its name and what it runs (every precision, anywhere) are :class:`~precsearch.backends.support.EmulatedSupport`.
    """

    def convert(self, model: nn.Module, recipes: Mapping[str, LayerRecipe]) -> nn.Module:
        """Replace each named non-BF16 Linear by an :class:`EmulatedFP8Linear`, in place.

        Raises:
            ValueError: A name is not an ``nn.Linear`` of the model (checked for
                every name before anything changes).
        """
        linears = linear_modules(model, list(recipes))
        self.check_supported(recipes, model_device(model))
        for index, (name, recipe) in enumerate(recipes.items()):
            if not recipe.precision.is_fp8:
                continue
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            # each layer its own stochastic-rounding seed (NVFP4 gradients)
            setattr(parent, child, EmulatedFP8Linear.from_linear(linears[name], recipe, seed=1000 * index))
        return model

    resets_converted = True

    def reset_converted(self, model: nn.Module) -> bool:
        """Every :class:`EmulatedFP8Linear` back to its state when converted (:meth:`EmulatedFP8Linear.reset_state`)."""
        for _, m in _fp8_layers(model):
            m.reset_state()
        return True

    def converted_layers(self, model: nn.Module) -> dict[str, Precision]:
        """Name -> precision of every :class:`EmulatedFP8Linear` in ``model``."""
        return {name: m.recipe.precision for name, m in _fp8_layers(model)}

    def track_stats(self, model: nn.Module, enabled: bool) -> None:
        """Switch :meth:`EmulatedFP8Linear.track_stats` on every converted layer."""
        for _, m in _fp8_layers(model):
            m.track_stats(enabled)

    def layer_stats(self, model: nn.Module) -> dict[str, dict[str, TensorStats]]:
        """Name -> role -> statistics, straight from each layer's quantize path (exact scales)."""
        return {name: stats for name, m in _fp8_layers(model) if (stats := m.layer_stats())}


def _fp8_layers(model: nn.Module) -> list[tuple[str, EmulatedFP8Linear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, EmulatedFP8Linear)]
