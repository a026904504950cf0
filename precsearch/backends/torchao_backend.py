"""The torchao backend: FP8 training through ``torchao.float8`` (dynamic per-tensor or per-row scaling).

Contract (on top of :mod:`precsearch.backends.base`):

* Only the precisions whose recipe names a torchao recipe run here (:data:`RECIPE_NAMES`: ``fp8_current`` as
  torchao's ``tensorwise``, ``fp8_rowwise`` as its ``rowwise``). Every other low-precision choice is refused
  with its recipe's reason (:mod:`precsearch.backends.capability`). torchao's ``rowwise_with_gw_hp`` has no
  :class:`~precsearch.precision.Precision` of its own yet, so a policy cannot ask for it.
* ``convert`` calls ``torchao.float8.convert_to_float8_training(model,
  config=..., module_filter_fn=fn)`` once per (precision, FP8 format), with ``fn(module, fqn)`` true only for
  the named Linear layers of that pair, then wraps each
  converted layer in a :class:`TorchaoPrecisionLinear` (child ``linear``). torchao
  keeps the original Parameter objects (``Float8Linear.from_float`` assigns
  ``mod.weight``/``mod.bias``), so an optimizer built before or after convert
  sees the same tensors; their names gain ``.linear``.
* FP8 is toggled per step by :class:`TorchaoPrecisionLinear.fp8_enabled`:
  ``Float8Linear`` has no off switch, so when the flag is False the wrapper
  calls ``F.linear`` on the same weight, which is exactly what ``nn.Linear``
  computes (bit-identical BF16 warm-up).
* Layers whose in/out features are not multiples of 16 cannot run
  (``torch._scaled_mm``'s rule, as torchao's ``_auto_filter_for_tensorwise``
  states); ``convert`` refuses them by name (:func:`unsupported_layers`).

Verified in torchao 0.16.0 (``pytorch/ao`` at tag v0.16.0, identical to the
wheel the H200 runs):

* ``convert_to_float8_training(module, *, module_filter_fn=None, config=None)``
  swaps ``nn.Linear`` children for which ``module_filter_fn(module, fqn)`` is
  true (``torchao/float8/float8_linear_utils.py``).
* ``Float8LinearConfig.from_recipe_name("tensorwise")`` is the default
  ``Float8LinearConfig()``: dynamic per-tensor scales, E4M3 input and weight,
  E5M2 grad_output, i.e. precsearch's HYBRID format; the forward GEMM uses fast
  (lower-precision) accumulation (``gemm_config_output``) like TE's current
  scaling fprop (``torchao/float8/config.py``). For the E4M3 format precsearch
  builds the config with an E4M3 ``cast_config_grad_output``.
* ``Float8LinearConfig.emulate=True`` runs the same casts with a high-precision
  matmul, on any device; :class:`TorchaoBackend` exposes it (``emulate=True``)
  so the conversion logic is tested on CPU.
* ``Float8Linear.forward`` casts its input to the CUDA autocast dtype when
  autocast is on, so under the probe's ``torch.autocast(bfloat16)`` it returns
  BF16 like ``nn.Linear`` (``torchao/float8/float8_linear.py``).

Speed: eager torchao float8 is slower than BF16 (measured on the H200 on a
Llama-8B MLP: 324 TFLOP/s eager FP8 vs 753 BF16; 1060 with ``torch.compile``),
because the casts and scale computations run as separate kernels; compile fuses
them. Every stack that trains with torchao's FP8 compiles it (torchtitan each
block, Accelerate's regional compilation), so the probe compiles each block of
its model on a GPU (:meth:`TorchaoBackend.probe_compiles_blocks`), the BF16
reference's too, and times what those stacks run. :func:`compile_model` (or
``TorchaoBackend(compile=True)``) compiles a whole model instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from precsearch.backends.base import (
    Backend,
    BackendUnavailable,
    UnsupportedRecipe,
    WrappedLinear,
    keep_input_norm,
    linear_modules,
    model_device,
    norm_input,
    refuse_layers,
)
from precsearch.backends.capability import TORCHAO_NEVER, torchao_import_error, torchao_support
from precsearch.precision import Fp8Format, LayerRecipe, Precision
from precsearch.recipes import RECIPES, recipe_for

#: precsearch precision -> torchao ``Float8LinearRecipeName`` value (each recipe's ``spec.torchao_recipe``).
RECIPE_NAMES: dict[Precision, str] = {p: r.spec.torchao_recipe for p, r in RECIPES.items() if r.spec.torchao_recipe}

#: in/out features of a torchao float8 GEMM must be multiples of this.
DIM_MULTIPLE = 16


def _float8() -> Any:
    """``torchao.float8``, or :class:`BackendUnavailable` saying why not."""
    error = torchao_import_error()
    if error is not None:
        raise BackendUnavailable(f"backend 'torchao': {error}")
    import torchao.float8

    return torchao.float8


def make_config(recipe: LayerRecipe, emulate: bool = False) -> Any:
    """The ``Float8LinearConfig`` for a recipe torchao names (:data:`RECIPE_NAMES`).

    A recipe that takes the policy's FP8 format gets an E4M3 gradient cast under ``e4m3``; one with fixed
    formats gets torchao's named config as it is.

    Raises:
        UnsupportedRecipe: The precision has no torchao recipe in :data:`RECIPE_NAMES`.
    """
    f8 = _float8()
    name = RECIPE_NAMES.get(recipe.precision)
    if name is None:
        raise UnsupportedRecipe(
            f"backend 'torchao' has no recipe for '{recipe.precision.value}'; valid: "
            f"{', '.join(p.value for p in RECIPE_NAMES)}"
        )
    if recipe.fp8_format is Fp8Format.HYBRID or not recipe_for(recipe.precision).fp8_encoded:
        config = f8.Float8LinearConfig.from_recipe_name(name)
    else:  # E4M3 everywhere: tensorwise with an E4M3 gradient cast
        from torchao.float8.config import e4m3_dtype

        config = f8.Float8LinearConfig(cast_config_grad_output=f8.CastConfig(target_dtype=e4m3_dtype))
    return dataclasses.replace(config, emulate=emulate) if emulate else config


class TorchaoPrecisionLinear(WrappedLinear):
    """A torchao ``Float8Linear`` with an FP8 on/off switch.

    Attributes:
        linear: The ``Float8Linear`` (it holds the original weight/bias Parameters).
        recipe: The layer's :class:`LayerRecipe`.
        fp8_enabled: When False the layer is exactly ``F.linear(x, weight, bias)``.
    """

    def __init__(self, linear: nn.Linear, recipe: LayerRecipe, original: nn.Module | None = None):
        super().__init__()
        self.linear = linear
        self.recipe = recipe
        self.fp8_enabled = True
        # the fused input norm lives in a child registered after ``linear``, so the Parameters keep
        # the original's order (weight, then layer_norm_weight)
        self.input_norm = nn.Module()
        keep_input_norm(self.input_norm, original if original is not None else linear)

    @property
    def layer_norm_weight(self) -> nn.Parameter | None:
        return self.input_norm.layer_norm_weight

    def forward(self, x: Tensor) -> Tensor:
        """FP8 through torchao when enabled, else the plain Linear on the same Parameters."""
        x = norm_input(self.input_norm, x)
        if self.fp8_enabled:
            return self.linear(x)
        return F.linear(x, self.linear.weight, self.linear.bias)

    def extra_repr(self) -> str:
        return f"precision={self.recipe.precision.value}, fp8_format={self.recipe.fp8_format.value}"


def unsupported_layers(model: nn.Module, recipes: Mapping[str, LayerRecipe]) -> dict[str, str]:
    """Layer -> why torchao cannot run it in FP8 (feature dims), for every FP8 layer of ``recipes``.

    Raises:
        ValueError: A name is not an ``nn.Linear`` of ``model``.
    """
    linears = linear_modules(model, list(recipes))
    problems = {}
    for name, recipe in recipes.items():
        lin = linears[name]
        if recipe.precision.is_fp8 and (lin.in_features % DIM_MULTIPLE or lin.out_features % DIM_MULTIPLE):
            problems[name] = (
                f"torchao float8 needs in/out features divisible by {DIM_MULTIPLE}, "
                f"got {lin.in_features}x{lin.out_features}"
            )
    return problems


def compile_model(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """``torch.compile(model, **compile_kwargs)``: how torchao float8 gets its speed.

    The result is a wrapper whose ``_orig_mod`` is ``model``; parameters and
    ``modules()`` pass through, so optimizers and :meth:`Backend.autocast` work
    on it. Toggling ``fp8_enabled`` recompiles once per value (a guard on the
    attribute), i.e. once at the end of the BF16 warm-up.
    """
    return torch.compile(model, **compile_kwargs)


def _unwrap(model: nn.Module) -> nn.Module:
    """The module under a ``torch.compile`` wrapper (or ``model`` itself)."""
    return getattr(model, "_orig_mod", model)


class TorchaoBackend(Backend):
    """torchao float8 training (the precisions with a torchao recipe: tensorwise, rowwise).

    Args:
        compile: ``convert`` returns :func:`compile_model` of the converted model.
        emulate: torchao's emulation mode (FP8 casts, high-precision matmul) on any
            device, for tests; the capability check is then skipped.
    """

    name = "torchao"
    fp8_linear = "torchao"  # keeps the unquantized input and no weight copy for the backward

    def __init__(self, *, compile: bool = False, emulate: bool = False):
        self.compile = compile
        self.emulate = emulate

    def probe_compiles_blocks(self, device: torch.device) -> bool:
        """True on a CUDA device, unless emulating or compiling the whole model (``compile``)."""
        return not self.compile and not self.emulate and torch.device(device).type == "cuda"

    def supported_precisions(self, device: torch.device) -> dict[Precision, str | None]:
        """The torchao-named precisions on their GPUs (anywhere when emulating); nothing else."""
        if not self.emulate:
            return torchao_support(device)
        # emulation has no hardware requirement: only the import and the recipe map matter
        error = torchao_import_error()
        return {
            p: TORCHAO_NEVER.get(p, error) if p.is_fp8 else None for p in Precision
        }

    def convert(self, model: nn.Module, recipes: Mapping[str, LayerRecipe]) -> nn.Module:
        """Swap the named Linears of torchao-named precisions for torchao ``Float8Linear`` behind a switch.

        Raises:
            ValueError: A name is not an ``nn.Linear`` of the model (checked first).
            UnsupportedRecipe: A precision torchao cannot run here, or a layer whose
                feature dims are not multiples of 16 (all named at once).
            BackendUnavailable: torchao does not import.
        """
        linears = linear_modules(model, list(recipes))
        self.check_supported(recipes, model_device(model))
        refuse_layers("torchao", unsupported_layers(model, recipes))
        fp8 = {n: r for n, r in recipes.items() if r.precision.is_fp8}
        # one conversion per torchao config: per precision and FP8 format
        for key in sorted({(r.precision.value, r.fp8_format.value) for r in fp8.values()}):
            names = {n for n, r in fp8.items() if (r.precision.value, r.fp8_format.value) == key}
            config = make_config(next(r for n, r in fp8.items() if n in names), self.emulate)
            _float8().convert_to_float8_training(
                model, config=config, module_filter_fn=lambda _mod, fqn, names=names: fqn in names
            )
        for name, recipe in fp8.items():
            parent_name, _, child = name.rpartition(".")
            converted = model.get_submodule(name)
            if converted is linears[name]:  # torchao skipped it: never silently leave BF16
                raise RuntimeError(f"torchao did not convert {name}")
            setattr(model.get_submodule(parent_name), child, TorchaoPrecisionLinear(converted, recipe, linears[name]))
        return compile_model(model) if self.compile else model

    def converted_layers(self, model: nn.Module) -> dict[str, Precision]:
        """Name -> precision of every :class:`TorchaoPrecisionLinear` (through a compile wrapper)."""
        return {
            n: m.recipe.precision
            for n, m in _unwrap(model).named_modules()
            if isinstance(m, TorchaoPrecisionLinear)
        }
