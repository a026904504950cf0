"""A precision as one object: :class:`Recipe`, whose docstring is the contract every precision keeps.

One module of this package per precision holds a subclass; the registry
(:mod:`precsearch.recipes.registry`) lists them, and every consumer asks the recipe of a
:class:`~precsearch.precision.Precision` (:func:`~precsearch.recipes.registry.recipe_for`) instead of
switching on its name. This module is in the base layer: it holds names and numbers only, never a
class of torch, Transformer Engine or torchao, so that the policy, the space and the exporters read it
without importing a backend. The code that acts on those names (the emulated scalers, the TE recipe
object, the exporters' files) lives with its consumer and looks the name up there.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import fields
from typing import Any, ClassVar

from precsearch.precision import AmaxAlgo, Fp8Format, LayerRecipe, Precision
from precsearch.recipes.spec import Capability, PrecisionSpec
from precsearch.soak import SoakFinding

#: The :class:`~precsearch.precision.LayerRecipe` fields a recipe may read (all but ``precision``).
SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(LayerRecipe) if f.name != "precision")


class Recipe(ABC):
    """One precision: its facts, the settings it reads and each consumer's name for it.

    The contract every recipe keeps (``tests/recipes/test_contract.py`` runs each consumer over each
    registered recipe):

    * **identity**: :attr:`precision` is its enum member and :attr:`spec` its row of facts (label, element
      bits and scale blocks, lowest GPU, nominal GEMM rate, frameworks' names);
    * **settings**: :attr:`settings` names the :class:`~precsearch.precision.LayerRecipe` fields it reads, in
      the order its Transformer Engine recipe takes them; a field no registered recipe reads is inert, and
      the space's inert rules, the TE recipe cache key and the sampler's unsampled settings derive from it;
    * **emulated quantizer**: :attr:`emulation` names its family of scalers in
      :data:`precsearch.fp8.scaling.SCALERS` (None: nothing to quantize, BF16); :attr:`history` says the
      scale comes from earlier steps' amaxes (state that needs warm batches before it is read);
    * **Transformer Engine**: :attr:`spec`'s ``te_recipe`` class with :meth:`te_kwargs`, or
      :attr:`te_never`, why TE cannot run it on any GPU; :attr:`te_max_capability` and :attr:`te_min_cuda`
      are TE's extra limits; :attr:`te_dim_multiple` what a GEMM's feature dims must divide by;
      :attr:`te_fp8_attention_from` the lowest GPU on which TE fuses FP8 attention under it;
      :attr:`te_stats_observable` whether TE's casts of it are reproduced for the tensor statistics;
    * **hardware**: ``spec.min_capability`` (None: anywhere); :attr:`torchao_never` why the torchao backend
      cannot run it on any GPU (None when ``spec.torchao_recipe`` names its torchao recipe, or BF16);
    * **memory**: ``spec.activation_bytes`` and ``spec.weight_bytes``, and :attr:`head_transient_bytes`, what
      TE's output layer holds beyond them per weight element (0 where not measured);
    * **frameworks**: ``spec.megatron_recipe`` / ``spec.megatron_config``, ``spec.torchtitan``,
      ``spec.torchao_recipe``, and for each that is None where the precision is low, a reason in
      :attr:`megatron_never` (a sentence) and :attr:`torchtitan_never` (what torchtitan's converters lack, the
      words after "there is no": ``delayed scaling``) (Accelerate reads ``spec.torchao_recipe`` and
      :attr:`accelerate_te`); :meth:`megatron_flags` and :meth:`megatron_environment` carry its settings to
      Megatron, :attr:`megatron_output_proj` whether Megatron runs the output layer in it;
      :meth:`accelerate_te_kwargs` and :meth:`accelerate_te_problem` carry it through Accelerate's
      ``TERecipeKwargs`` where :attr:`accelerate_te`;
      :attr:`converter_format` is the FP8 format torchtitan's converter runs for it whatever the policy says;
    * **soak**: :attr:`soak` is the long paired run its GEMMs passed (``benchmarks/bench_soak.py``, a row whose
      GEMMs all run it), or None where no such row has run; every recipe sets it, None included. ``validate``
      refuses a space that offers a recipe without one for some layer, unless the space sets
      ``search.allow_unsoaked`` (:mod:`precsearch.config.soak_checks`). A finding holds for the recipe's family
      (the settings it ran are in its ``ran``), not for each value of its settings. Where its row went
      non-finite, diverged or was decided damaging, :attr:`soak_refused` says what it measured, and ``validate``
      refuses every space that offers the recipe, with no opt-in (``soak`` is None then).
    """

    precision: ClassVar[Precision]
    spec: ClassVar[PrecisionSpec]
    soak: ClassVar[SoakFinding | None]
    soak_refused: ClassVar[str] = ""
    settings: ClassVar[tuple[str, ...]] = ()
    emulation: ClassVar[str | None] = None
    history: ClassVar[bool] = False
    te_never: ClassVar[str | None] = None
    te_max_capability: ClassVar[Capability | None] = None
    te_min_cuda: ClassVar[tuple[int, int] | None] = None
    te_dim_multiple: ClassVar[int] = 16
    te_fp8_attention_from: ClassVar[Capability | None] = None
    te_stats_observable: ClassVar[bool] = True
    torchao_never: ClassVar[str | None] = None
    head_transient_bytes: ClassVar[float] = 0.0
    megatron_never: ClassVar[str | None] = None
    megatron_output_proj: ClassVar[bool] = False
    torchtitan_never: ClassVar[str | None] = None
    converter_format: ClassVar[Fp8Format | None] = None
    #: Accelerate's ``TERecipeKwargs`` can build its TE recipe (for the whole model).
    accelerate_te: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = [name for name in ("precision", "spec", "soak") if not hasattr(cls, name)]
        if missing:
            raise TypeError(f"recipe {cls.__name__} must set {', '.join(missing)} (soak: None if no row ran it)")
        unknown = [s for s in cls.settings if s not in SETTINGS]
        if unknown:
            raise TypeError(f"recipe {cls.__name__}: settings {unknown} are not LayerRecipe fields; "
                            f"valid: {', '.join(SETTINGS)}")

    @property
    def name(self) -> str:
        """The value policies and space files write (``fp8_block``)."""
        return self.precision.value

    @property
    def low(self) -> bool:
        """Whether it quantizes at all (every recipe but BF16)."""
        return self.precision.is_fp8

    @property
    def fp8_encoded(self) -> bool:
        """Whether its elements take the policy's FP8 format (E4M3 or hybrid); NVFP4 and fixed-format recipes do not."""
        return "fp8_format" in self.settings

    @property
    def megatron_global_only(self) -> bool:
        """Megatron selects it with its global flags only: its precision config file cannot (delayed scaling)."""
        return self.spec.megatron_recipe is not None and self.spec.megatron_config is None

    def te_key(self, layer: LayerRecipe) -> tuple:
        """The fields its TE recipe object depends on: layers with one key share one recipe object."""
        return (self.precision, *(getattr(layer, s) for s in self.settings))

    def te_kwargs(self, layer: LayerRecipe) -> dict[str, Any]:
        """Keyword arguments of its ``spec.te_recipe`` class (an :class:`Fp8Format` stands for TE's ``Format``)."""
        return {"fp8_format": Fp8Format(layer.fp8_format)} if self.fp8_encoded else {}

    def megatron_flags(self, layer: LayerRecipe) -> list[str]:
        """Megatron's global flags selecting it with ``layer``'s settings ([] where Megatron has no name)."""
        if self.spec.megatron_recipe is None:
            return []
        return ["--fp8-format", Fp8Format(layer.fp8_format).value, "--fp8-recipe", self.spec.megatron_recipe]

    def megatron_training_recipe(self, fp8_format: str) -> dict[str, Any]:
        """Its ``training_recipe`` in Megatron's precision config file ({} for BF16)."""
        if self.spec.megatron_recipe is None:
            return {}
        return {"fp8_quantization_recipe": self.spec.megatron_recipe, "fp8_format": fp8_format}

    def accelerate_te_kwargs(self, layer: LayerRecipe) -> str:
        """Python source of the ``TERecipeKwargs(...)`` arguments for ``layer`` (with :attr:`accelerate_te`)."""
        raise NotImplementedError(f"Accelerate's TERecipeKwargs builds no {self.spec.te_recipe or self.name}")

    def accelerate_te_problem(self, layer: LayerRecipe) -> str | None:
        """Why ``layer``'s settings cannot reach TE through ``TERecipeKwargs``, or None (with :attr:`accelerate_te`)."""
        return None

    def megatron_environment(self, layer: LayerRecipe) -> dict[str, str]:
        """Environment variables carrying ``layer``'s settings to TE under Megatron ({} where there are none)."""
        return {}


def amax_algo(layer: LayerRecipe) -> str:
    """``layer``'s amax reduction as its value (``max``)."""
    return AmaxAlgo(layer.amax_compute_algo).value
