"""The contract every numeric backend keeps.

A backend turns a probe model (plain ``torch.nn.Linear`` layers, see
:mod:`precsearch.probe.model.llama3`) into one whose Linear layers compute in the
precision a policy assigns them, and switches FP8 on and off per step (for
the BF16 warm-up).

Contract (checked for every backend by ``tests/backends/test_contract.py``):

* ``convert`` changes only the Linear layers named in the assignment whose
  recipe is not BF16; every other module, parameter value and name stays as it
  was, so optimiser state built afterwards sees the same parameters in the same
  order. BF16 layers are bit-identical to the unconverted model.
* ``convert`` keeps weights: the converted layer starts from the same values.
* ``autocast(model, enabled=False)`` makes every layer compute as BF16.
* ``converted_layers`` reports the precision each converted layer runs.
* ``unit_weight`` finds each unit's weight Parameter in the converted model, in
  the plain probe's shape (the fixed-state reading compares its gradients).
* A recipe the backend or the device cannot run is refused by
  ``check_supported`` with :class:`UnsupportedRecipe`, naming the recipe, the
  device and what would be valid, before any work starts. It is never silently
  replaced by another recipe.
* ``track_stats(model, True)`` makes the following forward/backward passes
  compute FP8 statistics; ``layer_stats`` then returns, for every converted
  layer that ran FP8 in the latest such pass, one
  :class:`~precsearch.backends.tensor_stats.TensorStats` per tensor role
  (``input``, ``weight``, ``grad_output``: amax, per-tensor scale or None,
  overflow and underflow shares in [0, 1], non-finite count). A backend that
  cannot observe its FP8 casts returns ``{}`` (the default), never made-up
  numbers.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import LayerRecipe, Precision
from precsearch.backends.tensor_stats import TensorStats
# the refusals live with the torch-free half of the contract; importable from here as before
from precsearch.backends.support import BackendSupport, BackendUnavailable, UnsupportedRecipe  # noqa: F401


class Backend(BackendSupport, ABC):
    """A numeric backend: converts Linear layers and toggles FP8 per step.

    What it runs where (``supported_precisions``, ``check_supported``, ``memory_knob_problem``, ``name``)
    is :class:`~precsearch.backends.support.BackendSupport`, which needs no torch.
    """

    #: True for a backend that rebuilds every unit (BF16 ones too) from its library's modules, as
    #: the training stack does (TE): BF16 units then compute BF16 within that library's rounding,
    #: and Parameters are new and renamed, instead of untouched.
    rebuilds_stack: bool = False
    #: Which FP8 Linear the memory model counts for this backend's FP8 layers
    #: (:data:`~precsearch.probe.memory.peak.FP8_LINEARS`): Transformer Engine's, unless it says otherwise.
    fp8_linear: str = "te"

    @abstractmethod
    def supported_precisions(self, device: torch.device) -> dict[Precision, str | None]:
        """For each precision: None if it runs on ``device``, else the reason it cannot."""

    def probe_compiles_blocks(self, device: torch.device) -> bool:
        """Whether the probe compiles each transformer block (``Llama3.compile_blocks``) of a model this backend
        converted on ``device``: for a backend whose FP8 layers are fast only compiled, as the stacks that train
        with it run them (the memory model then counts what a compiled block keeps). Default: no."""
        return False

    def for_memory(self, knobs: MemoryKnobs) -> "Backend":
        """The backend that converts layers as ``knobs`` ask (e.g. FP8 weight storage); default: self."""
        return self

    def build_optimizer(self, model: nn.Module, knobs: MemoryKnobs, *, lr: float, betas: tuple[float, float],
                        weight_decay: float) -> torch.optim.Optimizer:
        """The optimizer a probe trains with under ``knobs`` (default: ``torch.optim.AdamW``).

        On a GPU it is the fused implementation, as training stacks run Adam
        (Megatron-Core and NeMo use a fused Adam): one kernel per step and no
        temporaries the size of the parameters.
        """
        fused = model_device(model).type == "cuda"
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay,
                                 fused=fused or None)

    @abstractmethod
    def convert(self, model: nn.Module, recipes: Mapping[str, LayerRecipe]) -> nn.Module:
        """Convert, in place, the Linear layers named in ``recipes``; return the model.

        ``recipes`` maps fully qualified module names (``model.named_modules()``)
        to the recipe that layer runs; layers absent from it, or with a BF16
        recipe, are left untouched.
        """

    #: ``reset_converted`` can put converted layers back (so a probe process keeps its model between probes;
    #: a backend without it keeps none, which would only hold device memory)
    resets_converted: bool = False

    def reset_converted(self, model: nn.Module) -> bool:
        """Put the state ``convert`` gave each converted layer back (scaling history, FP8 switch, statistics),
        leaving Parameters alone; True if done, False if this backend cannot (the default).

        A probe process reuses a model this way between probes of the same policy structure, its weights
        initialised again in place (:mod:`precsearch.probe.model.reuse`): after this call the model must
        train exactly as one just converted from the same weights. A backend that returns False gets a
        fresh build every probe.
        """
        return False

    def plain_tensors(self, model: nn.Module, plain: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each Parameter of the plain model (``plain``: name -> Parameter, taken before :meth:`convert`) mapped
        to the tensor of the converted ``model`` that holds its values, in the plain shape and layout.

        Writing into these sets the converted model's weights in place (:mod:`precsearch.probe.model.reuse`).
        The default: the plain Parameters themselves, which a backend that wraps layers keeps.
        """
        return dict(plain)

    @abstractmethod
    def converted_layers(self, model: nn.Module) -> dict[str, Precision]:
        """Fully qualified name -> precision, for every layer this backend converted."""

    def unit_weight(self, model: nn.Module, unit: str) -> torch.Tensor:
        """The weight Parameter precision unit ``unit`` (a name of :func:`precsearch.arch.units.unit_names`)
        computes with, whatever module now holds it; same shape and layout as the plain probe's.

        The default finds it under the unit's own name; a backend that fuses units into one
        module (TE's ``LayerNormMLP``) overrides this.
        """
        return model.get_submodule(unit).weight

    def track_stats(self, model: nn.Module, enabled: bool) -> None:
        """Compute FP8 statistics in the following passes (or stop); default: nothing to switch.

        They cost extra passes over every FP8 operand, so the probe switches them
        on only for the steps it collects (:mod:`precsearch.probe.measure.diagnostics`).
        """

    def layer_stats(self, model: nn.Module) -> dict[str, dict[str, TensorStats]]:
        """Layer -> role -> FP8 statistics of the latest pass run with :meth:`track_stats` on.

        Only layers that ran FP8 in that pass appear, each with every role of
        :data:`~precsearch.fp8.scaling.ROLES` it quantized. Default: ``{}`` (this
        backend cannot observe its FP8 casts).
        """
        return {}

    @contextlib.contextmanager
    def autocast(self, model: nn.Module, enabled: bool) -> Iterator[None]:
        """Run the enclosed forward (and its backward) with FP8 on or off.

        The default toggles ``fp8_enabled`` on every converted module; backends
        with a library context (Transformer Engine) override this.
        """
        modules = [m for m in model.modules() if hasattr(m, "fp8_enabled")]
        previous = [m.fp8_enabled for m in modules]
        for m in modules:
            m.fp8_enabled = enabled
        try:
            yield
        finally:
            for m, prev in zip(modules, previous):
                m.fp8_enabled = prev


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def refuse_layers(backend: str, problems: dict[str, str]) -> None:
    """Raise :class:`UnsupportedRecipe` naming every layer (name -> why) ``backend`` cannot convert; none: return."""
    if problems:
        listed = "; ".join(f"{n}: {why}" for n, why in problems.items())
        raise UnsupportedRecipe(f"backend '{backend}' cannot convert {len(problems)} layer(s): {listed}")


def linear_modules(model: nn.Module, names: list[str]) -> dict[str, nn.Linear]:
    """The Linear module for each name; ValueError naming the first that is not one."""
    modules = dict(model.named_modules())
    found: dict[str, nn.Linear] = {}
    for name in names:
        if name == "":
            raise ValueError("cannot convert the root module in place; name a child Linear")
        module = modules.get(name)
        if module is None:
            raise ValueError(f"layer {name!r} is not a module of the model")
        if not isinstance(module, nn.Linear):
            raise ValueError(f"layer {name!r} is a {type(module).__name__}, not an nn.Linear")
        found[name] = module
    return found


def keep_input_norm(converted: nn.Module, original: nn.Module) -> None:
    """Give ``converted`` the RMSNorm fused into ``original``'s input (the same Parameter), if it has one.

    The probe's ``linear_qkv`` and ``linear_fc1`` normalise their input
    (:class:`precsearch.probe.model.llama3.NormLinear`); a backend that swaps the GEMM
    must keep that norm, and :meth:`WrappedLinear.norm_input` applies it.
    """
    weight = getattr(original, "layer_norm_weight", None)
    if isinstance(weight, nn.Parameter):
        converted.layer_norm_weight = weight
        converted.eps = original.eps
    else:
        converted.register_parameter("layer_norm_weight", None)


def norm_input(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` RMS-normalised by ``module.layer_norm_weight`` (float32 math, as the probe), or ``x`` without one."""
    weight = module.layer_norm_weight
    if weight is None:
        return x
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + module.eps)).to(x.dtype)


class WrappedLinear(nn.Module):
    """Base of a backend's converted layer: wraps a library Linear and exposes its shape and Parameters.

    Subclasses set ``self.linear`` (the library module that owns ``weight``/``bias``),
    ``self.recipe`` and ``self.fp8_enabled``, call :func:`keep_input_norm`, and
    implement ``forward`` (starting with :func:`norm_input`).
    """

    linear: nn.Module
    layer_norm_weight: nn.Parameter | None

    @property
    def in_features(self) -> int:
        return self.linear.in_features

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias
