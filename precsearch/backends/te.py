"""The Transformer Engine backend: per-layer FP8 recipes on real FP8 tensor cores.

Contract (on top of :mod:`precsearch.backends.base`):

* ``convert`` rebuilds the probe from TE's fused modules in Megatron-Core's
  layout (:mod:`precsearch.backends.te_stack`): every precision unit becomes a
  :class:`~precsearch.backends.te_stack.TEPrecisionLinear` around a
  ``te.LayerNormLinear``, ``te.Linear`` or ``te.LayerNormMLP`` (BF16 units
  too, as the training stack runs them), attention becomes
  ``te.DotProductAttention`` with TE's fused RoPE. Weight values are copied in.
  **TE modules own new Parameter objects**, so ``convert`` must run before the
  optimizer is built (the probe runner does this).
* While the step's FP8 is on, every unit enters ``te.autocast(enabled=<unit is
  FP8>, recipe=<its recipe>)`` around its TE module, so each unit runs its own
  recipe (TE nests: the innermost context decides) and BF16 units run BF16;
  with FP8 off (the warm-up, the reference) no context is entered at all.
* :meth:`TEBackend.autocast` toggles ``fp8_enabled`` on every wrapper and,
  while FP8 is on, also holds ONE outer ``te.autocast(enabled=True)`` around the
  forward, for the delayed-scaling bookkeeping explained below.
* :meth:`TEBackend.fp8_metadata` reports, per converted layer, what TE holds
  after a forward (whether FP8 ran, the recipe state, quantizers, and for
  delayed scaling the scales and amax histories).
* :meth:`TEBackend.track_stats` / :meth:`TEBackend.layer_stats`: per-layer FP8
  statistics from the tensors each layer hands to TE, against TE's own scale
  for delayed scaling (how, and why not TE's debug API: :mod:`precsearch.backends.te_stats`).

Facts verified in Transformer Engine 2.20.2 (the wheel the H200 runs; paths in
the NVIDIA/TransformerEngine repository):

* ``te.autocast(enabled, calibrating, recipe, amax_reduction_group)`` is the
  2.x context (``transformer_engine/pytorch/quantization.py``, class
  ``autocast``); ``fp8_autocast`` and ``fp8_model_init`` are deprecated
  aliases of ``autocast`` and ``quantized_model_init``. ``__enter__`` saves the
  global state and ``__exit__`` restores it, so contexts nest and the inner
  one's ``enabled``/``recipe`` win.
* Delayed scaling keeps its state per module: ``fp8_meta["scaling_fwd"]`` and
  ``["scaling_bwd"]`` are ``DelayedScalingRecipeState`` objects with ``scale``
  (3 forward slots: input, weight, output; 2 backward: grad_output,
  grad_input) and ``amax_history`` (``amax_history_len`` x slots)
  (``quantization.py``, ``DelayedScalingRecipeState``;
  ``transformer_engine/pytorch/module/base.py``, ``set_meta_tensor``). A module
  re-creates that state only when the recipe *type* changes, so toggling FP8
  off for the warm-up and on again keeps it.
* Each delayed-scaling module registers its amax/scale tensors once in global
  buffers keyed by ``str(recipe)`` and the amax reduction group
  (``FP8GlobalStateManager.add_fp8_tensors_to_global_buffer``). The amax
  reduction and scale update of the forward tensors runs in
  ``autocast_exit`` when the OUTERMOST enabled context exits with grad enabled
  (``autocast_depth == 0``), over *every* registered delayed-scaling module, not
  only those that ran inside it; the backward update runs in the backward of
  the module that ran first in an outermost context (``is_first_fp8_module``;
  ``module/linear.py``, ``_check_fp8_reduce_and_update``).
* What per-layer contexts imply on one GPU: no process group, so nothing is
  reduced across ranks (``reduce_and_update_fp8_tensors`` all-reduces only when
  ``torch.distributed`` is initialised with more than one rank). If each
  layer's context were the outermost one, every layer's exit (and every layer's
  backward) would run the update over all delayed-scaling layers: N update
  launches per step for N FP8 layers instead of one. The numbers stay right with
  TE's default fused update: its kernel rolls a module's amax history and
  recomputes its scale only when the module's newest amax is non-zero, i.e.
  only for modules that ran since their last update
  (``transformer_engine/common/recipe/delayed_scaling.cu``, ``kernel_bulk``:
  ``if (last_amax != 0.0f)``, added by TE PR #825 "Avoid amax roll for
  non-run modules"). The unfused Python path (``NVTE_UNFUSED_FP8_UPDATE=1`` or a
  callable ``amax_compute_algo``; ``quantization.py``,
  ``_update_amax_history``) rolls unconditionally, so there per-layer contexts
  would shorten the history to ``amax_history_len / N`` steps. The one outer
  context held by :meth:`TEBackend.autocast` makes every per-layer context a
  nested one, so the forward update runs once per step (at the outer exit).
  The backward update is claimed by the first FP8 module that runs inside an
  outermost context; since ``autocast.__exit__`` restores the whole autocast
  state (``get_autocast_state``/``set_autocast_state``, ``is_first_fp8_module``
  included), every nested layer would claim it again, so
  :class:`TEPrecisionLinear` keeps it consumed after its context exits: one
  backward update per step too, as with one model-wide context, on either
  path.
* ``DelayedScaling``'s ``str()`` (its reduction key) omits
  ``amax_compute_algo`` (``transformer_engine/common/recipe/__init__.py``,
  ``_make_repr``), so two delayed-scaling layers that differ only in that field
  would share one buffer and be updated with one algorithm; ``convert`` refuses
  such a mix.
* Megatron-LM refuses ``first_last_layers_bf16`` with delayed scaling
  (``megatron/core/transformer/transformer_config.py``, ``__post_init__``:
  "Delayed scaling does not support first / last layer in BF16"; the comment
  in ``megatron/core/fp8_utils.py`` says per-layer enter/exit "caus[es]
  incorrect amax reduction behavior"; ``transformer_block.py`` uses one outer
  context for delayed scaling and per-layer contexts otherwise). precsearch
  allows BF16 layers anywhere with delayed scaling, and mixes recipes per
  unit: BF16 units nest ``te.autocast(enabled=False)`` and FP8 units their own
  recipe's context inside the one outer context, so the amax bookkeeping is
  the once-per-step update Megatron gets from its outer context (checked on
  the GPU by ``tests/backends/test_gpu_backends.py``, with the probe built
  from TE's fused modules).
* TE honours ``torch.autocast``: ``TransformerEngineBaseModule.
  set_activation_dtype`` (``module/base.py``) takes the autocast GPU dtype when
  autocast is on, and ``module/linear.py`` casts the input, the weight (BF16
  path) and the bias to it; the output is BF16 under the probe's
  ``torch.autocast(bfloat16)``, as for ``nn.Linear``.
* FP8 GEMMs need the input's leading dims to multiply to a multiple of 8 and
  the last dim, and the weight's dims, to be multiples of 16
  (``transformer_engine/pytorch/utils.py``, ``assert_dim_for_fp8_exec``);
  ``convert`` checks the feature dims (16, 32 for MXFP8), the token count is
  checked by TE at the first forward.
* ``te.Linear(in_features, out_features, bias=, init_method=, params_dtype=,
  device=)``: ``init_method(weight)`` initialises the weight before TE wraps it
  (and before it quantizes it under ``quantized_model_init``); the bias is
  zero-initialised; without a bias TE stores an empty tensor, not a Parameter
  (``module/linear.py``, ``Linear.__init__``; ``module/base.py``,
  ``reset_parameters``).

FP8 primary weights (``TEBackend(fp8_weights=True)``, experimental): each
``te.Linear`` is created inside ``te.quantized_model_init(enabled=True,
recipe=<its recipe>, preserve_high_precision_init_val=True)`` so its weight is
a TE ``QuantizedTensor`` quantized from the original float32 values (copied in
by ``init_method``). Such weights cannot be updated by ``torch.optim.AdamW``:
build the optimizer with :func:`build_optimizer` (``master_weights=True``) and
then call :func:`seed_master_weights` so the FP32 master copies start from the
original values rather than the dequantized FP8 ones (``FusedAdam.
initialize_state`` would otherwise dequantize). With delayed scaling the
weight's first cast uses TE's initial scale of 1 (no amax seen yet); later
casts use the calibrated scale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from precsearch.arch.units import unit_names
from precsearch.backends.base import Backend, UnsupportedRecipe, linear_modules, model_device
from precsearch.backends.capability import require_te, te_support
from precsearch.backends.te_knobs import te_memory_knob_problem
from precsearch.backends.te_optimizer import build_optimizer, seed_master_weights
from precsearch.backends.te_stack import TEPrecisionLinear, build_te_stack, convert_linears
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Fp8Format, LayerRecipe, Precision
from precsearch.probe.diagnostics import TensorStats

#: Feature dims of an FP8 GEMM must be multiples of this (TE ``assert_dim_for_fp8_exec``).
FP8_DIM_MULTIPLE = 16
#: MXFP8 scales 1x32 blocks along the reduced dim.
MXFP8_DIM_MULTIPLE = 32

#: TE forward quantizer slots of a Linear, and backward ones (``csrc/common.h``: FP8FwdTensors).
FWD_SLOTS = ("input", "weight", "output")
BWD_SLOTS = ("grad_output", "grad_input")



def _te_format(fmt: Fp8Format) -> Any:
    from transformer_engine.common.recipe import Format

    return Format.HYBRID if fmt is Fp8Format.HYBRID else Format.E4M3


def recipe_key(recipe: LayerRecipe) -> tuple:
    """The fields of ``recipe`` that its TE recipe object depends on (layers sharing it share one)."""
    p = recipe.precision
    if p is Precision.FP8_DELAYED:
        return (p, recipe.fp8_format, recipe.amax_history_len, recipe.amax_compute_algo, recipe.margin)
    if p is Precision.NVFP4:
        return (p,)
    return (p, recipe.fp8_format)


def make_te_recipe(recipe: LayerRecipe) -> Any:
    """The ``transformer_engine.common.recipe`` object for a low-precision :class:`LayerRecipe`.

    ``fp8_format`` is passed to every FP8 recipe (TE accepts HYBRID and E4M3 for
    all of them); NVFP4 has its own fixed formats (E2M1 data, E4M3 scales).

    Raises:
        ValueError: For a BF16 recipe (it needs no TE recipe).
    """
    from transformer_engine.common import recipe as te_recipe

    p = recipe.precision
    if p is Precision.FP8_DELAYED:
        return te_recipe.DelayedScaling(
            fp8_format=_te_format(recipe.fp8_format),
            amax_history_len=recipe.amax_history_len,
            amax_compute_algo=recipe.amax_compute_algo.value,
            margin=recipe.margin,
        )
    if p is Precision.FP8_CURRENT:
        return te_recipe.Float8CurrentScaling(fp8_format=_te_format(recipe.fp8_format))
    if p is Precision.FP8_BLOCK:
        return te_recipe.Float8BlockScaling(fp8_format=_te_format(recipe.fp8_format))
    if p is Precision.MXFP8:
        return te_recipe.MXFP8BlockScaling(fp8_format=_te_format(recipe.fp8_format))
    if p is Precision.NVFP4:
        return te_recipe.NVFP4BlockScaling()
    raise ValueError(f"precision {p.value!r} needs no Transformer Engine recipe")


def fp8_metadata(unit: TEPrecisionLinear) -> dict[str, Any]:
    """What TE holds for this layer after its latest forward (tensors are detached copies).

    Keys: ``precision``; ``fp8_ran`` (TE's ``module.fp8``: FP8 was on at the
    latest forward); ``recipe`` (class name of the recipe TE last used);
    ``fwd_state``/``bwd_state`` (recipe-state class names) and
    ``fwd_quantizers``/``bwd_quantizers`` (quantizer class names) once FP8
    has run; and for delayed scaling ``scale``/``amax_history`` dicts keyed by
    slot (``input``, ``weight``, ``output``, ``grad_output``, ``grad_input``).
    """
    lin = unit.linear
    meta: dict[str, Any] = getattr(lin, "fp8_meta", {})
    recipe = meta.get("recipe")
    info: dict[str, Any] = {
        "precision": unit.recipe.precision.value,
        "fp8_ran": bool(getattr(lin, "fp8", False)),
        "recipe": type(recipe).__name__ if recipe is not None else None,
        "scale": {},
        "amax_history": {},
    }
    quantizers = getattr(lin, "quantizers", {})
    for key, role, slots in (("scaling_fwd", "fwd", FWD_SLOTS), ("scaling_bwd", "bwd", BWD_SLOTS)):
        state = meta.get(key)
        if state is None:
            continue
        info[f"{role}_state"] = type(state).__name__
        info[f"{role}_quantizers"] = [type(q).__name__ for q in quantizers.get(key, []) if q is not None]
        if hasattr(state, "scale") and hasattr(state, "amax_history"):
            for i, slot in enumerate(slots):
                info["scale"][slot] = state.scale[i].detach().clone()
                info["amax_history"][slot] = state.amax_history[:, i].detach().clone()
    return info


def _dim_problems(linears: Mapping[str, nn.Linear], recipes: Mapping[str, LayerRecipe]) -> dict[str, str]:
    """Layer -> why its feature dims cannot run its low-precision recipe (empty when all can)."""
    problems = {}
    for name, recipe in recipes.items():
        if not recipe.precision.is_fp8:
            continue
        multiple = MXFP8_DIM_MULTIPLE if recipe.precision is Precision.MXFP8 else FP8_DIM_MULTIPLE
        lin = linears[name]
        if lin.in_features % multiple or lin.out_features % multiple:
            problems[name] = (
                f"{recipe.precision.value} needs in/out features divisible by {multiple}, "
                f"got {lin.in_features}x{lin.out_features}"
            )
    return problems


def _check_delayed_keys(recipes: Mapping[str, LayerRecipe]) -> None:
    """Refuse delayed-scaling layers that TE would put in one buffer with different algorithms."""
    algos: dict[tuple, tuple[str, str]] = {}
    for name, r in recipes.items():
        if r.precision is not Precision.FP8_DELAYED:
            continue
        te_key = (r.fp8_format, r.amax_history_len, r.margin)
        seen = algos.setdefault(te_key, (name, r.amax_compute_algo.value))
        if seen[1] != r.amax_compute_algo.value:
            raise UnsupportedRecipe(
                f"backend 'te' cannot run delayed-scaling layers {seen[0]} ({seen[1]}) and {name} "
                f"({r.amax_compute_algo.value}) that differ only in amax_compute_algo: Transformer "
                "Engine updates them as one group with one algorithm. Give them one algorithm."
            )


class TEBackend(Backend):
    """Transformer Engine: per-layer FP8 (delayed, current, block; MXFP8/NVFP4 on Blackwell).

    Args:
        fp8_weights: Keep converted layers' weights as FP8 ``QuantizedTensor``
            Parameters (experimental; needs :func:`build_optimizer` with
            ``master_weights=True`` and :func:`seed_master_weights`).
    """

    name = "te"
    rebuilds_stack = True

    def __init__(self, *, fp8_weights: bool = False, fp8_attention: str = "off"):
        self.fp8_weights = fp8_weights
        self.fp8_attention = fp8_attention

    @property
    def needs_master_weights(self) -> bool:
        """True when converted weights are FP8 and the optimizer must keep FP32 masters."""
        return self.fp8_weights

    def memory_knob_problem(self, knobs: MemoryKnobs, device: torch.device) -> str | None:
        return te_memory_knob_problem(knobs, device)

    def for_memory(self, knobs: MemoryKnobs) -> "TEBackend":
        if (knobs.fp8_weights, knobs.fp8_attention) == (self.fp8_weights, self.fp8_attention):
            return self
        return TEBackend(fp8_weights=knobs.fp8_weights, fp8_attention=knobs.fp8_attention)

    def build_optimizer(self, model: nn.Module, knobs: MemoryKnobs, *, lr: float, betas: tuple[float, float],
                        weight_decay: float) -> torch.optim.Optimizer:
        """``torch.optim.AdamW`` for the default knobs, else TE ``FusedAdam`` with them."""
        if knobs.is_default:
            return super().build_optimizer(model, knobs, lr=lr, betas=betas, weight_decay=weight_decay)
        if knobs.optimizer_knobs.is_default:
            return super().build_optimizer(model, knobs, lr=lr, betas=betas, weight_decay=weight_decay)
        param_dtype = next(p.dtype for p in model.parameters() if p.dtype.is_floating_point)
        exp_avg, exp_avg_sq = knobs.moment_dtypes("fp32" if param_dtype == torch.float32 else "bf16")
        master = knobs.master
        opt = build_optimizer(model.parameters(), lr, betas, weight_decay,
                              master_weights=master != "none",
                              master_weight_dtype="fp16" if master == "fp16" else "fp32",
                              store_param_remainders=master == "remainders",
                              exp_avg_dtype=exp_avg, exp_avg_sq_dtype=exp_avg_sq)
        if knobs.fp8_weights:
            seed_master_weights(opt)
        return opt

    def supported_precisions(self, device: torch.device) -> dict[Precision, str | None]:
        """From :func:`precsearch.backends.capability.te_support`: GPU generation, CUDA, TE import."""
        return te_support(device)

    def convert(self, model: nn.Module, recipes: Mapping[str, LayerRecipe]) -> nn.Module:
        """Rebuild the probe from Transformer Engine's fused modules, each unit under its recipe, in place.

        For the probe (:class:`~precsearch.probe.model.Llama3`) every unit becomes
        a TE module (:mod:`precsearch.backends.te_stack`), BF16 ones included, as
        in Megatron-Core; units absent from ``recipes`` run BF16. Any other model
        (a Hugging Face Llama under :func:`precsearch.load_policy`) gets a
        ``te.Linear`` for each named FP8 ``nn.Linear`` only. Must run before the
        optimizer is built: the TE modules own new Parameters (holding the same
        values).

        Raises:
            ValueError: A name is not a unit (an ``nn.Linear``) of the model (checked first).
            UnsupportedRecipe: A recipe this GPU/TE cannot run, feature dims an FP8
                GEMM cannot take, or delayed-scaling units TE cannot keep apart.
            BackendUnavailable: Transformer Engine does not import.
        """
        linears = linear_modules(model, list(recipes))
        self.check_supported(recipes, model_device(model))
        problems = _dim_problems(linears, recipes)
        if problems:
            listed = "; ".join(f"{n}: {why}" for n, why in problems.items())
            raise UnsupportedRecipe(f"backend 'te' cannot convert {len(problems)} layer(s): {listed}")
        _check_delayed_keys(recipes)
        te_recipes: dict[tuple, Any] = {}

        def shared(recipe: LayerRecipe) -> Any:
            key = recipe_key(recipe)
            if key not in te_recipes:
                te_recipes[key] = make_te_recipe(recipe)
            return te_recipes[key]

        if _is_probe(model):
            every = {n: recipes.get(n, LayerRecipe()) for n in unit_names(model.cfg)}
            build_te_stack(model, every, shared, self.fp8_weights, self.fp8_attention)
        else:
            convert_linears(model, recipes, shared, self.fp8_weights)
        return model

    def converted_layers(self, model: nn.Module) -> dict[str, Precision]:
        """Unit -> precision of every unit that runs FP8 (BF16 TE units are not reported)."""
        return {u: m.recipe.precision for m in _units(model) if m.is_fp8 for u in m.units}

    @contextlib.contextmanager
    def autocast(self, model: nn.Module, enabled: bool) -> Iterator[None]:
        """Toggle the step's FP8 on every unit; while on, hold one outer ``te.autocast``.

        The outer context makes every unit's own context a nested one, so TE's
        delayed-scaling amax/scale update runs once per step instead of once per
        unit (see the module docstring). Its recipe is the first FP8 unit's (so it
        never asks for hardware the units do not already need); the inner
        contexts decide what each unit runs.
        """
        fp8 = [m for m in _units(model) if m.is_fp8]
        with super().autocast(model, enabled and bool(fp8)):
            if not (enabled and fp8):
                yield
                return
            with require_te().autocast(enabled=True, recipe=fp8[0].te_recipe):
                yield

    def track_stats(self, model: nn.Module, enabled: bool) -> None:
        """Switch statistics on or off on every unit, dropping those of earlier passes."""
        for m in _units(model):
            m.track_stats, m.last_stats, m.last_numel = enabled, {}, {}

    def layer_stats(self, model: nn.Module) -> dict[str, dict[str, TensorStats]]:
        """Unit -> role -> statistics of every FP8 unit observed with statistics on."""
        return {unit: roles for m in _units(model) for unit, roles in m.layer_stats().items()}

    def fp8_metadata(self, model: nn.Module) -> dict[str, dict[str, Any]]:
        """Unit -> :func:`fp8_metadata` for every FP8 unit."""
        return {u: fp8_metadata(m) for m in _units(model) if m.is_fp8 for u in m.units}


def _is_probe(model: nn.Module) -> bool:
    """The probe's layout (:class:`precsearch.probe.model.Llama3`), told by shape: backends import no probe."""
    return hasattr(model, "cfg") and hasattr(model, "decoder") and hasattr(model, "output_layer")


def _units(model: nn.Module) -> list[TEPrecisionLinear]:
    return [m for m in model.modules() if isinstance(m, TEPrecisionLinear)]
