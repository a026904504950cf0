"""The probe rebuilt from Transformer Engine's fused modules, as Megatron-Core builds Llama 3.

:func:`build_te_stack` swaps, in place, every module of the plain probe
(:mod:`precsearch.probe.model.llama3`) that Megatron-Core runs on TE:

=============================  ===========================================  =====================================
probe module                   TE module                                    precision
=============================  ===========================================  =====================================
``self_attention.linear_qkv``  ``te.LayerNormLinear`` (RMSNorm fused)       the unit's recipe, or BF16
``self_attention.core_attention``  ``te.DotProductAttention`` (bshd, causal) BF16 (TE's fused attention)
``self_attention.rope``        TE's fused ``apply_rotary_pos_emb``           float32 angles, as the probe
``self_attention.linear_proj`` ``te.Linear``                                the unit's recipe, or BF16
``mlp``                        ``te.LayerNormMLP`` (SwiGLU) when ``linear_fc1`` and ``linear_fc2``
                               share one recipe, else ``te.LayerNormLinear`` + ``te.Linear``
``output_layer``               ``te.Linear`` if its recipe is FP8, else left a torch Linear (as Megatron's)
=============================  ===========================================  =====================================

Weights are copied in, in the probe's dtype; every layout already is TE's
(Megatron's grouped q/k/v rows, gate rows before up rows: TE's SwiGLU is
``silu(first half) * second half``, ``common/include/transformer_engine/activation.h``).
Each unit runs under its own nested ``te.autocast`` (:class:`TEPrecisionLinear`),
inside the one outer context that :meth:`~precsearch.backends.te.TEBackend.autocast`
holds while FP8 is on.

**Tensor parallelism.** On a probe whose blocks were split over ranks
(``model.tensor_parallel``, :mod:`precsearch.probe.parallel.tensor_parallel`), the GEMM
modules take ``tp_group`` with ``parallel_mode`` column (q/k/v, fc1) or row
(proj, fc2) and ``sequence_parallel``, and ``DotProductAttention`` the group's
head split; TE runs the collectives, so the model's own hooks are reset to
identities. TE splits and gathers a sequence-parallel input along its first
dimension (Megatron's sequence-first layout), so under sequence parallelism
each unit sees its ``(B, T, D)`` input transposed to ``(T, B, D)``: a free view
at micro-batch 1, a copy above.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from precsearch.arch.units import OUTPUT_LAYER
from precsearch.backends.base import WrappedLinear
from precsearch.backends.capability import gpu_capability, require_te
from precsearch.backends.te_knobs import fp8_attention_precisions
from precsearch.backends.tp_group import PARTIAL_GRAD, SPLIT, TensorParallel
from precsearch.backends.te_stats import activation, high_precision_weight, observable, operand_stats
from precsearch.precision import LayerRecipe
from precsearch.backends.tensor_stats import TensorStats

#: Delayed-scaling slots of a ``te.LayerNormMLP`` (``FP8FwdTensors``: GEMM1_INPUT, GEMM1_WEIGHT, GEMM2_WEIGHT).
_MLP_SLOTS = {("linear_fc1", "input"): ("scaling_fwd", 0), ("linear_fc1", "weight"): ("scaling_fwd", 1),
              ("linear_fc2", "weight"): ("scaling_fwd", 4)}


class TEPrecisionLinear(WrappedLinear):
    """One TE GEMM module (``Linear``, ``LayerNormLinear`` or ``LayerNormMLP``) under its unit's recipe.

    While the step's FP8 is on (``fp8_enabled``, the default) the module runs
    inside ``te.autocast(enabled=<recipe is FP8>, recipe=<its TE recipe>)``;
    with FP8 off it runs with no context at all (BF16, as the reference and the
    warm-up).

    Attributes:
        linear: The TE module; it owns the Parameters.
        recipe: The unit's :class:`LayerRecipe`.
        te_recipe: The TE recipe object (shared by units of one :func:`~precsearch.backends.te.recipe_key`),
            None for BF16 units.
        units: The precision units this module computes (two for a fused ``LayerNormMLP``).
        fp8_enabled: The step's FP8 switch (:meth:`Backend.autocast`).
        track_stats, last_stats, last_numel: FP8 statistics of the latest pass made with statistics on.
    """

    def __init__(self, linear: nn.Module, recipe: LayerRecipe, te_recipe: Any, units: tuple[str, ...],
                 norm_eps: float | None = None, seq_first: bool = False):
        super().__init__()
        self.seq_first = seq_first  # TE's sequence parallelism splits dim 0: hand it (T, B, D)
        self.linear, self.recipe, self.te_recipe, self.units = linear, recipe, te_recipe, units
        self.register_parameter("layer_norm_weight", None)  # TE owns the fused norm: nothing to apply here
        self.norm_eps = norm_eps
        self.fp8_enabled = True  # outside Backend.autocast a unit runs its recipe in its own context
        self.track_stats = False
        self.last_stats: dict[tuple[str, str], dict[str, Tensor]] = {}
        self.last_numel: dict[tuple[str, str], int] = {}
        self._autocast = require_te().autocast
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager

        self._te_state = FP8GlobalStateManager

    @property
    def weight(self) -> Tensor:
        return self.linear.weight if hasattr(self.linear, "weight") else self.linear.fc1_weight

    @property
    def bias(self) -> Tensor | None:
        """The bias Parameter, or None (TE keeps an empty tensor when there is none)."""
        return self.linear.bias if getattr(self.linear, "use_bias", False) else None

    @property
    def is_fp8(self) -> bool:
        return self.recipe.precision.is_fp8

    def _run(self, x: Tensor) -> Tensor:
        if not self.seq_first:
            return self.linear(x)
        # free views at micro-batch 1 (a size-1 dimension's stride does not count); copies above
        return self.linear(x.transpose(0, 1).contiguous()).transpose(0, 1).contiguous()

    def forward(self, x: Tensor) -> Tensor:
        """The TE module's output, in the unit's recipe while the step's FP8 is on."""
        if not self.fp8_enabled:
            return self._run(x)
        with self._autocast(enabled=self.is_fp8, recipe=self.te_recipe):
            out = self._run(x)
            claimed = self.is_fp8 and not self._te_state.quantization_state.is_first_fp8_module
        if claimed:
            # te.autocast.__exit__ restores is_first_fp8_module; keep it consumed, so that inside
            # an outer context only the step's first FP8 unit runs the backward scale update.
            self._te_state.quantization_state.is_first_fp8_module = False
        if self.track_stats and self.is_fp8 and observable(self.recipe):
            self._observe_forward(x, out)
        return out

    def _gemm_input(self, x: Tensor) -> Tensor:
        """What the first GEMM quantizes: the RMS-normalised input for fused-norm modules."""
        norm = getattr(self.linear, "layer_norm_weight", None)
        if norm is None:
            return activation(x)
        x32 = x.detach().float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return activation((norm.detach().float() * x32).to(x.dtype))

    def _observe_forward(self, x: Tensor, out: Tensor) -> None:
        first, last = self.units[0], self.units[-1]
        self._observe(first, "input", self._gemm_input(x))
        if len(self.units) == 1:
            self._observe(first, "weight", high_precision_weight(self.linear.weight))
            if out.requires_grad:
                out.register_hook(lambda grad: self._observe(last, "grad_output", activation(grad)))
            return
        # a fused LayerNormMLP: its inner operands (fc2's input, fc1's gradient) are not observable here
        self._observe(first, "weight", high_precision_weight(self.linear.fc1_weight))
        self._observe(last, "weight", high_precision_weight(self.linear.fc2_weight))

    def _observe(self, unit: str, role: str, t: Tensor) -> None:
        slot = _MLP_SLOTS.get((unit.rsplit(".", 1)[-1], role)) if len(self.units) > 1 else None
        self.last_stats[unit, role] = operand_stats(self.recipe, role, t, self.linear.fp8_meta, slot=slot)
        self.last_numel[unit, role] = t.numel()

    def layer_stats(self) -> dict[str, dict[str, TensorStats]]:
        """Unit -> role -> :class:`TensorStats` observed since ``track_stats`` last changed."""
        out: dict[str, dict[str, TensorStats]] = {}
        for (unit, role), s in self.last_stats.items():
            out.setdefault(unit, {})[role] = TensorStats.from_quantization(s, self.last_numel[unit, role])
        return out

    def extra_repr(self) -> str:
        return f"units={len(self.units)}, precision={self.recipe.precision.value}"


class TECoreAttention(nn.Module):
    """``te.DotProductAttention`` on ``(B, T, heads, head_dim)`` q, k, v; returns ``(B, T, dim)``.

    With ``fp8_recipe`` (a delayed or current FP8 recipe with ``fp8_dpa=True``) the
    attention runs in FP8 (QK^T, softmax, PV on FP8 inputs, FP8 tensors saved for the
    backward) whenever ``qkv``, the block's q/k/v unit, has FP8 on for the step, so it
    follows the FP8 warm-up; otherwise BF16.
    """

    def __init__(self, n_heads: int, head_dim: int, n_kv_heads: int, fp8_recipe: Any = None,
                 qkv: "TEPrecisionLinear | None" = None, tp_group: Any = None):
        super().__init__()
        te = require_te()
        split = {} if tp_group is None else {"tp_group": tp_group}  # heads are the whole model's; TE divides them
        self.attention = te.DotProductAttention(n_heads, head_dim, num_gqa_groups=n_kv_heads,
                                                attention_dropout=0.0, qkv_format="bshd", attn_mask_type="causal",
                                                **split)
        self.fp8_recipe = fp8_recipe
        self._qkv = [qkv]  # a list, so the unit is not registered twice as a submodule
        self._autocast = te.autocast

    @property
    def runs_fp8(self) -> bool:
        qkv = self._qkv[0]
        return self.fp8_recipe is not None and qkv is not None and qkv.fp8_enabled

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if not self.runs_fp8:
            return self.attention(q, k, v)
        with self._autocast(enabled=True, recipe=self.fp8_recipe):
            return self.attention(q, k, v)


def fp8_attention_recipe(te_recipe: Any, recipe: LayerRecipe, mode: str, capability: tuple[int, int] | None) -> Any:
    """A copy of ``te_recipe`` with ``fp8_dpa`` on, or None when ``mode`` is off or TE cannot on this GPU."""
    if mode == "off" or recipe.precision not in fp8_attention_precisions(capability):
        return None
    return dataclasses.replace(te_recipe, fp8_dpa=True)


def te_rope(q: Tensor, k: Tensor, angles: Tensor) -> tuple[Tensor, Tensor]:
    """TE's fused half-split RoPE (``interleaved=False``) with the probe's float32 angles ``(T, head_dim)``."""
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

    freqs = angles[:, None, None, :]
    return (apply_rotary_pos_emb(q, freqs, tensor_format="bshd", fused=True),
            apply_rotary_pos_emb(k, freqs, tensor_format="bshd", fused=True))


class TEFusedMLP(nn.Module):
    """The block's MLP as one ``te.LayerNormMLP`` (both units share one recipe)."""

    def __init__(self, unit: TEPrecisionLinear):
        super().__init__()
        self.layernorm_mlp = unit

    def forward(self, x: Tensor) -> Tensor:
        return self.layernorm_mlp(x)


def _copier(*sources: Tensor) -> Callable[[Tensor], None]:
    """An ``init_method`` that copies ``sources`` in turn, once each (TE keeps it: drop them after)."""
    queue = [s.detach() for s in sources]

    def copy(weight: Tensor) -> None:
        if not queue:
            raise RuntimeError("a converted unit's init_method copies the original weight once, at convert")
        with torch.no_grad():
            weight.copy_(queue.pop(0))

    return copy


def _make(build: Callable[..., nn.Module], like: nn.Module, te_recipe: Any, fp8_weights: bool,
          split: tuple[TensorParallel, str] | None = None, **kwargs: Any) -> nn.Module:
    """A TE module in ``like``'s dtype, device and train mode, with its bias and fused norm weight if it has
    them (the weights come in through ``init_method``); FP8 primary weights when asked.

    ``split``: the TP group and TE's ``parallel_mode`` (``column``, ``row``, or ``mlp`` for a
    ``LayerNormMLP``, which splits both of its GEMMs); ``like`` then holds this rank's slice and
    ``kwargs`` the whole model's features, as TE takes them.
    """
    te = require_te()
    ctx = (te.quantized_model_init(enabled=True, recipe=te_recipe, preserve_high_precision_init_val=True)
           if fp8_weights and te_recipe is not None else contextlib.nullcontext())
    weight, bias, norm = like.weight, like.bias, getattr(like, "layer_norm_weight", None)
    if split is not None:
        tp, mode = split
        kwargs |= {"tp_group": tp.group, "tp_size": tp.size, "sequence_parallel": tp.sequence_parallel}
        kwargs |= {"set_parallel_mode": True} if mode == "mlp" else {"parallel_mode": mode}
    with ctx:
        module = build(bias=bias is not None, params_dtype=weight.dtype, device=weight.device, **kwargs)
    with torch.no_grad():
        if norm is not None:
            module.layer_norm_weight.copy_(norm.detach())
        if bias is not None:
            module.bias.copy_(bias.detach())
    for p in module.parameters():
        p.requires_grad_(weight.requires_grad)
    if split is not None:
        _mark_split(module, split[0])
    module.train(like.training)
    return module


def _mark_split(module: nn.Module, tp: TensorParallel) -> None:
    """Mark the GEMM weights as TP slices and, under sequence parallelism, the fused norm's weight as a
    partial gradient (each rank normalises its own tokens; without it TE sums the input gradient first)."""
    for name, p in module.named_parameters():
        if name in ("weight", "fc1_weight", "fc2_weight"):
            setattr(p, SPLIT, True)
        elif name == "layer_norm_weight" and tp.sequence_parallel:
            setattr(p, PARTIAL_GRAD, True)


def _whole(features: int, tp: TensorParallel | None) -> int:
    return features * (1 if tp is None else tp.size)


def te_linear(name: str, lin: nn.Linear, te_recipe: Any, fp8_weights: bool,
              split: tuple[TensorParallel, str] | None = None) -> nn.Module:
    """``te.Linear`` with ``lin``'s shape and weight (``split``: see :func:`_make`)."""
    te = require_te()
    tp, mode = split if split is not None else (None, None)
    return _make(te.Linear, lin, te_recipe, fp8_weights, split,
                 in_features=_whole(lin.in_features, tp if mode == "row" else None),
                 out_features=_whole(lin.out_features, tp if mode == "column" else None),
                 init_method=_copier(lin.weight), name=name)


def te_layernorm_linear(name: str, lin: nn.Linear, te_recipe: Any, fp8_weights: bool,
                        split: tuple[TensorParallel, str] | None = None) -> nn.Module:
    """``te.LayerNormLinear`` (RMSNorm) with ``lin``'s shape, weight and fused norm weight (column-parallel
    under ``split``)."""
    te = require_te()
    tp = split[0] if split is not None else None
    return _make(te.LayerNormLinear, lin, te_recipe, fp8_weights, split, in_features=lin.in_features,
                 out_features=_whole(lin.out_features, tp), eps=lin.eps, normalization="RMSNorm",
                 init_method=_copier(lin.weight), name=name)


def te_layernorm_mlp(mlp: nn.Module, te_recipe: Any, fp8_weights: bool, tp: TensorParallel | None = None
                     ) -> nn.Module:
    """``te.LayerNormMLP`` (RMSNorm, SwiGLU) holding ``mlp``'s fc1 (gate, up) and fc2 weights; under ``tp``
    fc1 is column- and fc2 row-parallel (this rank's gate and up rows are the slices ``mlp`` holds)."""
    te = require_te()
    fc1, fc2 = mlp.linear_fc1, mlp.linear_fc2  # fc1 carries the dtype, device, mode and norm; neither has a bias
    return _make(te.LayerNormMLP, fc1, te_recipe, fp8_weights, None if tp is None else (tp, "mlp"),
                 hidden_size=fc1.in_features, ffn_hidden_size=_whole(fc2.in_features, tp), eps=fc1.eps,
                 normalization="RMSNorm", activation="swiglu",
                 init_method=_copier(fc1.weight), output_layer_init_method=_copier(fc2.weight))


def convert_linears(model: nn.Module, recipes: Mapping[str, LayerRecipe], te_recipe: Callable[[LayerRecipe], Any],
                    fp8_weights: bool = False) -> None:
    """Any model (a Hugging Face ``LlamaForCausalLM``, a user's own): each named FP8 ``nn.Linear`` becomes a
    ``te.Linear`` under its recipe, in place; BF16 layers stay as they are."""
    for name, recipe in recipes.items():
        if recipe.precision.is_fp8:
            lin, rec = model.get_submodule(name), te_recipe(recipe)
            unit = TEPrecisionLinear(te_linear(name, lin, rec, fp8_weights), recipe, rec, (name,))
            model.set_submodule(name, unit)


def build_te_stack(model: nn.Module, recipes: Mapping[str, LayerRecipe], te_recipe: Callable[[LayerRecipe], Any],
                   fp8_weights: bool = False, fp8_attention: str = "off") -> None:
    """Swap the probe's modules for TE's, in place (see the module docstring).

    Args:
        model: The plain probe (:class:`precsearch.probe.model.llama3.Llama3`).
        recipes: Unit name -> recipe, for every unit of the model.
        te_recipe: The TE recipe object of an FP8 recipe (shared per recipe key); None for BF16.
        fp8_weights: FP8 units keep their weights in FP8 only (``te.quantized_model_init``).
        fp8_attention: ``dpa``: blocks whose q/k/v unit runs a recipe TE can fuse FP8
            attention for on this GPU (delayed scaling on Hopper) run attention in FP8
            (:class:`TECoreAttention`); ``off``: BF16 attention.
    """
    cfg = model.cfg
    capability = gpu_capability(next(model.parameters()).device)
    tp: TensorParallel | None = getattr(model, "tensor_parallel", None)
    seq_first = tp is not None and tp.sequence_parallel

    def unit(name: str, build: Callable[..., nn.Module], module: nn.Module, mode: str | None = None
             ) -> TEPrecisionLinear:
        r = recipes[name]
        rec = te_recipe(r) if r.precision.is_fp8 else None
        eps = getattr(module, "eps", None)
        split = (tp, mode) if tp is not None and mode is not None else None
        return TEPrecisionLinear(build(name, module, rec, fp8_weights, split), r, rec, (name,), eps,
                                 seq_first=split is not None and seq_first)

    for i, layer in enumerate(model.decoder.layers):
        prefix = f"decoder.layers.{i}."
        attn, mlp = layer.self_attention, layer.mlp
        attn.linear_qkv = unit(prefix + "self_attention.linear_qkv", te_layernorm_linear, attn.linear_qkv, "column")
        attn.linear_proj = unit(prefix + "self_attention.linear_proj", te_linear, attn.linear_proj, "row")
        qkv = recipes[prefix + "self_attention.linear_qkv"]
        dpa = (fp8_attention_recipe(attn.linear_qkv.te_recipe, qkv, fp8_attention, capability)
               if attn.linear_qkv.te_recipe is not None else None)
        attn.core_attention = TECoreAttention(cfg.n_heads, cfg.head_dim, cfg.n_kv_heads, dpa, attn.linear_qkv,
                                              tp_group=None if tp is None else tp.group)
        attn.rope = te_rope
        attn.tp_in = attn.tp_out = mlp.tp_in = mlp.tp_out = _identity  # TE's modules run the collectives
        fc1, fc2 = recipes[prefix + "mlp.linear_fc1"], recipes[prefix + "mlp.linear_fc2"]
        if fc1 == fc2:
            rec = te_recipe(fc1) if fc1.precision.is_fp8 else None
            fused = te_layernorm_mlp(mlp, rec, fp8_weights, tp)
            names = (prefix + "mlp.linear_fc1", prefix + "mlp.linear_fc2")
            layer.mlp = TEFusedMLP(TEPrecisionLinear(fused, fc1, rec, names, mlp.linear_fc1.eps, seq_first=seq_first))
        else:
            mlp.linear_fc1 = unit(prefix + "mlp.linear_fc1", te_layernorm_linear, mlp.linear_fc1, "column")
            mlp.linear_fc2 = unit(prefix + "mlp.linear_fc2", te_linear, mlp.linear_fc2, "row")
    if recipes[OUTPUT_LAYER].precision.is_fp8:  # under TP: this rank's vocabulary rows; the model gathers its input
        model.output_layer = unit(OUTPUT_LAYER, te_linear, model.output_layer)


def _identity(x: Tensor) -> Tensor:
    return x
