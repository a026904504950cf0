"""The Transformer Engine backend: per-layer FP8 recipes on real FP8 tensor cores.

How it drives TE (its contract, the TE 2.x facts it relies on, FP8 primary weights): ``te.md`` beside this file.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from precsearch.arch.units import unit_names
from precsearch.backends import fp8_state_adam
from precsearch.backends.base import Backend, UnsupportedRecipe, linear_modules, model_device, refuse_layers
from precsearch.backends.capability import require_te, te_support
from precsearch.backends.te_knobs import te_memory_knob_problem
from precsearch.backends.te_optimizer import build_optimizer, seed_master_weights
from precsearch.backends.te_stack import TEPrecisionLinear, build_te_stack, convert_linears
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Fp8Format, LayerRecipe, Precision
from precsearch.recipes import recipe_for
from precsearch.backends.tensor_stats import TensorStats

#: TE forward quantizer slots of a Linear, and backward ones (``csrc/common.h``: FP8FwdTensors).
FWD_SLOTS = ("input", "weight", "output")
BWD_SLOTS = ("grad_output", "grad_input")



def _te_format(fmt: Fp8Format) -> Any:
    from transformer_engine.common.recipe import Format

    return Format.HYBRID if fmt is Fp8Format.HYBRID else Format.E4M3


def recipe_key(recipe: LayerRecipe) -> tuple:
    """The fields of ``recipe`` that its TE recipe object depends on (layers sharing it share one)."""
    return recipe_for(recipe.precision).te_key(recipe)


def make_te_recipe(recipe: LayerRecipe) -> Any:
    """The ``transformer_engine.common.recipe`` object for a low-precision :class:`LayerRecipe`.

    The class is the recipe's ``spec.te_recipe`` and its arguments the recipe's
    :meth:`~precsearch.recipes.base.Recipe.te_kwargs`: ``fp8_format`` for every FP8
    recipe (TE accepts HYBRID and E4M3 for all of them); NVFP4 has its own fixed
    formats (E2M1 data, E4M3 scales) and takes its three switches as TE's
    ``disable_*`` fields.

    Raises:
        ValueError: For a BF16 recipe (it needs no TE recipe).
    """
    from transformer_engine.common import recipe as te_recipe

    r = recipe_for(recipe.precision)
    if r.spec.te_recipe is None:
        raise ValueError(f"precision {r.name!r} needs no Transformer Engine recipe")
    kwargs = {k: _te_format(v) if isinstance(v, Fp8Format) else v for k, v in r.te_kwargs(recipe).items()}
    return getattr(te_recipe, r.spec.te_recipe)(**kwargs)


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
        multiple = recipe_for(recipe.precision).te_dim_multiple  # TE ``assert_dim_for_fp8_exec``
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
        if not recipe_for(r.precision).history:
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
        """``torch.optim.AdamW`` for the default knobs; FP8 moments (where
        :func:`~precsearch.backends.fp8_state_adam.applies`): the fused
        :class:`~precsearch.backends.fp8_state_adam.FP8StateAdamW`; else TE ``FusedAdam`` with them."""
        if knobs.is_default:
            return super().build_optimizer(model, knobs, lr=lr, betas=betas, weight_decay=weight_decay)
        if knobs.optimizer_knobs.is_default:
            return super().build_optimizer(model, knobs, lr=lr, betas=betas, weight_decay=weight_decay)
        param_dtype = fp8_state_adam.param_dtype_name(model.parameters())
        exp_avg, exp_avg_sq = knobs.moment_dtypes(param_dtype)
        master = knobs.master
        if master != "none" and param_dtype == "fp32":
            warnings.warn(f"master weights ({master}) on FP32 parameters are a second FP32 copy of them: cast the "
                          "model to BF16 before building the optimizer for the memory the knobs promise",
                          stacklevel=2)
        own = fp8_state_adam.for_knobs(model.parameters(), knobs, lr=lr, betas=betas, weight_decay=weight_decay)
        if own is not None:
            return own
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

        For the probe (:class:`~precsearch.probe.model.llama3.Llama3`) every unit becomes
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
        refuse_layers("te", _dim_problems(linears, recipes))
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

    #: A kept probe model is set again in place (:meth:`reset_converted`); with FP8 primary weights it is built.
    resets_converted = True

    def reset_converted(self, model: nn.Module) -> bool:
        """Every TE module's FP8 state as a fresh build leaves it; False with FP8 primary weights (their FP8 copies
        and masters are made at build), which then rebuild.

        Only delayed scaling keeps state between steps: each module's ``scaling_fwd``/``scaling_bwd`` recipe state,
        a scale (ones when made) and an amax history (zeros). They are reset in place, because TE's global amax
        buffers hold these same tensors; the recipe objects are the ones the model was built with (the key of a
        kept model is its recipes), so TE does not make new ones. Current and block scaling keep none.
        """
        if self.fp8_weights:
            return False
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, TEPrecisionLinear):
                    module.fp8_enabled, module.track_stats, module.last_stats, module.last_numel = True, False, {}, {}
                meta = getattr(module, "fp8_meta", None)
                for key in ("scaling_fwd", "scaling_bwd"):
                    state = meta.get(key) if isinstance(meta, dict) else None
                    if state is not None and hasattr(state, "amax_history"):
                        state.amax_history.zero_()
                        state.scale.fill_(1.0)
        return True

    def plain_tensors(self, model: nn.Module, plain: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The TE stack's tensors for the plain probe's Parameters: a unit's weight (:meth:`unit_weight`), the
        RMSNorm weight TE fused into a unit's module, and the plain Parameters TE left in place (embedding, final
        norm, a BF16 output layer). Any other model keeps its plain Parameters."""
        if not _is_probe(model):
            return dict(plain)
        norms = {u: m.linear.layer_norm_weight for m in _units(model) for u in m.units[:1]
                 if getattr(m.linear, "layer_norm_weight", None) is not None}
        units = set(unit_names(model.cfg))
        out = {}
        for name, tensor in plain.items():
            owner, _, leaf = name.rpartition(".")
            if owner in units and leaf == "weight":
                out[name] = self.unit_weight(model, owner)
            elif owner in norms and leaf == "layer_norm_weight":
                out[name] = norms[owner]
            else:
                out[name] = model.get_parameter(name)
            if out[name].shape != tensor.shape:
                raise RuntimeError(f"the TE stack holds {name} as {tuple(out[name].shape)}, "
                                   f"the plain probe as {tuple(tensor.shape)}")
        return out

    def unit_weight(self, model: nn.Module, unit: str) -> torch.Tensor:
        """A unit's weight; an MLP fused into one ``te.LayerNormMLP`` holds both units' (``fc1_weight`` and
        ``fc2_weight``, in the plain layout)."""
        for m in _units(model):
            if len(m.units) == 2 and unit in m.units:
                return m.linear.fc1_weight if unit == m.units[0] else m.linear.fc2_weight
        return super().unit_weight(model, unit)

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
    """The probe's layout (:class:`precsearch.probe.model.llama3.Llama3`), told by shape: backends import no probe."""
    return hasattr(model, "cfg") and hasattr(model, "decoder") and hasattr(model, "output_layer")


def _units(model: nn.Module) -> list[TEPrecisionLinear]:
    return [m for m in model.modules() if isinstance(m, TEPrecisionLinear)]
