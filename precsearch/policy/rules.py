"""A precision policy: ordered rules that map Linear layer names to recipes.

A policy is what one trial chose and what ``precsearch export`` writes. It is
stated in names, not in a model: rules are shell-glob patterns over fully
qualified module names, optionally limited to some transformer blocks (first k,
last k, or listed indices). Rules are tried in order and the first match
decides; a layer no rule matches gets the default precision.

Names are precision units (:mod:`precsearch.arch.units`): Megatron-Core's
``decoder.layers.3.mlp.linear_fc1``, or the Hugging Face names they compute
(``model.layers.3.mlp.gate_proj`` and ``up_proj``). A pattern matches a unit
when it matches the unit's name or one of its Hugging Face names, and every
Hugging Face name of a unit must resolve to the same precision, since one fused
GEMM computes them all; otherwise :class:`PrecisionConflict`. The same policy
therefore applies to the probe, to the full-depth model, to Megatron-Core and to
a Hugging Face ``LlamaForCausalLM``.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, get_args

from precsearch.arch.units import BLOCKS_PATTERN, hf_names, layer_names, unit_of
from precsearch.precision import LayerRecipe, Precision
from precsearch.storage import MASTER_DTYPES, MOMENT_DTYPES, STATE_DTYPES
from precsearch.recipes import DEFAULT_PRECISION

_BLOCK_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def block_index(name: str) -> int | None:
    """The transformer block a module belongs to (``…layers.7.…`` -> 7), else None."""
    match = _BLOCK_INDEX.search(name)
    return int(match.group(1)) if match else None


class PrecisionConflict(ValueError):
    """Names computed by one fused unit (q/k/v, gate/up) were given different precisions."""


@dataclass(frozen=True)
class Rule:
    """Layers matching any of ``modules`` (and, if set, the block selector) run ``precision``."""

    name: str
    modules: tuple[str, ...]
    precision: Precision
    first: int | None = None
    last: int | None = None
    indices: tuple[int, ...] | None = None

    @property
    def limits_blocks(self) -> bool:
        return self.first is not None or self.last is not None or self.indices is not None

    def names_match(self, name: str, alias: str | None = None) -> bool:
        """Whether a pattern matches ``name`` or, when ``alias`` is None, any name it answers to
        (:func:`~precsearch.arch.units.layer_names`); with ``alias``, ``name`` or that one alias."""
        names = layer_names(name) if alias is None else (name, alias)
        return any(fnmatch.fnmatchcase(n, p) for p in self.modules for n in names)

    def matches(self, name: str, n_layers: int, alias: str | None = None) -> bool:
        """Whether the layer ``name`` (or its ``alias``) of a model with ``n_layers`` blocks falls under this rule."""
        if not self.names_match(name, alias):
            return False
        if not self.limits_blocks:
            return True
        index = block_index(name)
        if index is None:
            return False
        return (
            (self.indices is not None and index in self.indices)
            or (self.first is not None and index < self.first)
            or (self.last is not None and index >= n_layers - self.last)
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "modules": list(self.modules), "precision": self.precision.value}
        layers = {k: v for k, v in (("first", self.first), ("last", self.last)) if v is not None}
        if self.indices is not None:
            layers["indices"] = list(self.indices)
        return data | ({"layers": layers} if layers else {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Rule":
        layers = data.get("layers") or {}
        indices = layers.get("indices")
        return cls(
            name=str(data["name"]),
            modules=tuple(data["modules"]),
            precision=Precision(data["precision"]),
            first=layers.get("first"),
            last=layers.get("last"),
            indices=tuple(indices) if indices is not None else None,
        )


Fp8Attention = Literal["off", "dpa", "mha"]
"""FP8 attention (TE recipes' ``fp8_dpa`` / ``fp8_mha``): off, the attention core, or the whole MHA block."""
FP8_ATTENTION: tuple[str, ...] = get_args(Fp8Attention)


@dataclass(frozen=True)
class MemoryKnobs:
    """Training-state settings that change peak memory (applied by the ``te`` backend).

    Attributes:
        master_weights: The optimizer keeps FP32 master copies of (BF16 or FP8)
            parameters (TE ``FusedAdam(master_weights=True)``).
        moment_dtype: Both AdamW moments: ``param`` (the parameters' dtype, as
            ``torch.optim.AdamW``), ``fp32``, ``bf16``, ``fp8`` (E4M3 with a
            per-tensor scale; TE ``FusedAdam`` ``exp_avg_dtype``/``exp_avg_sq_dtype``)
            or ``fp8_block`` (E4M3 with a scale per 128 elements, the second moment
            as its square root: precsearch's ``FP8StateAdamW`` only).
        fp8_weights: FP8 layers keep their weights only in FP8
            (``te.quantized_model_init``); implies FP32 master weights, and BF16
            moments become FP32 (TE's FP8-parameter Adam kernel takes FP32 moments;
            FP8 moments are dequantized to FP32 for it and stay FP8).
        exp_avg_dtype: The first moment's dtype when it differs from ``moment_dtype``
            (None: ``moment_dtype``).
        exp_avg_sq_dtype: The second moment's, likewise.
        master_dtype: How master weights are kept when there are any (see
            :data:`MASTER_DTYPES`); with ``fp8_weights`` they are always FP32
            (TE's FP8-parameter kernel), so the field is then ignored.
        fp8_attention: ``dpa`` runs the attention core (QK^T, softmax, PV) in
            FP8 in blocks whose q/k/v unit runs delayed or current FP8, ``mha``
            also keeps q/k/v and the attention output in FP8 between the GEMMs.
    """

    master_weights: bool = False
    moment_dtype: str = "param"
    fp8_weights: bool = False
    exp_avg_dtype: str | None = None
    exp_avg_sq_dtype: str | None = None
    master_dtype: str = "fp32"
    fp8_attention: str = "off"

    def __post_init__(self) -> None:
        for name, valid in (("moment_dtype", MOMENT_DTYPES), ("exp_avg_dtype", (None, *STATE_DTYPES)),
                            ("exp_avg_sq_dtype", (None, *STATE_DTYPES)), ("master_dtype", MASTER_DTYPES),
                            ("fp8_attention", FP8_ATTENTION)):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name} {getattr(self, name)!r}; valid: {', '.join(map(str, valid))}")

    @property
    def is_default(self) -> bool:
        """True when no knob is set (plain AdamW on the parameters, no FP8 weights or attention)."""
        return self == MemoryKnobs()

    @property
    def uses_master_weights(self) -> bool:
        """Whether the optimizer keeps master weights (asked for, or implied by ``fp8_weights``)."""
        return self.master_weights or self.fp8_weights

    @property
    def master(self) -> str:
        """How master weights are kept: ``none`` or one of :data:`MASTER_DTYPES`."""
        if self.fp8_weights:
            return "fp32"
        return self.master_dtype if self.master_weights else "none"

    @property
    def optimizer_knobs(self) -> "MemoryKnobs":
        """These knobs without FP8 attention (which the optimizer does not see)."""
        return replace(self, fp8_attention="off")

    def moment_dtypes(self, param_dtype: str) -> tuple[str, str]:
        """The (first, second) AdamW moment dtypes, each ``fp32``, ``bf16``, ``fp8`` or ``fp8_block``."""
        chosen = []
        for own in (self.exp_avg_dtype, self.exp_avg_sq_dtype):
            dtype = own or self.moment_dtype
            dtype = param_dtype if dtype == "param" else dtype
            chosen.append("fp32" if self.fp8_weights and dtype == "bf16" else dtype)
        return chosen[0], chosen[1]

    def moments(self, param_dtype: str) -> str:
        """The AdamW moment dtype when both are alike, else ``mixed``."""
        first, second = self.moment_dtypes(param_dtype)
        return first if first == second else "mixed"

    def changed(self) -> list[str]:
        """``name=value`` for every knob that differs from its default, in field order."""
        default = MemoryKnobs()
        return [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]

    def resolved(self, param_dtype: str) -> "MemoryKnobs":
        """The same training state stated with the fewest non-default knobs, for ``param_dtype`` parameters.

        With FP32 parameters (and no FP8 weights) master weights would copy the
        parameters (TE skips them) and FP32 moments are the parameters' dtype, so the
        standard set-up resolves to the defaults, which any backend runs.
        """
        if param_dtype != "fp32" or self.fp8_weights:
            return self
        first, second = self.moment_dtypes(param_dtype)
        return replace(self, master_weights=False, master_dtype="fp32",
                       moment_dtype="param" if first == second == "fp32" else self.moment_dtype,
                       exp_avg_dtype=None if first == second == "fp32" else self.exp_avg_dtype,
                       exp_avg_sq_dtype=None if first == second == "fp32" else self.exp_avg_sq_dtype)

    def to_dict(self) -> dict[str, Any]:
        """The knobs as ``policy.yaml`` writes them (field name -> value)."""
        return asdict(self)


#: The standard mixed-precision training state: FP32 master weights and FP32 AdamW moments beside BF16 parameters
#: (Megatron-Core's default optimizer state; with FP32 parameters it resolves to the defaults).
FP32_MASTER_AND_MOMENTS = MemoryKnobs(master_weights=True, moment_dtype="fp32")


def member_rules(rules: tuple[Rule, ...], name: str, n_layers: int) -> dict[str, Rule | None]:
    """For each Hugging Face name computed by ``name``'s unit, the first rule matching it or the unit.

    A name that is no precision unit (a custom model's module) stands alone.
    """
    unit = unit_of(name)
    if unit is None:
        return {name: next((r for r in rules if r.matches(name, n_layers)), None)}
    return {m: next((r for r in rules if r.matches(unit, n_layers, alias=m)), None) for m in hf_names(unit)}


@dataclass(frozen=True)
class Policy:
    """Per-layer precision plus the training knobs that go with it.

    Attributes:
        rules: Ordered rules; the first that matches a layer decides.
        default: Precision of layers no rule matches.
        recipe: FP8 recipe settings shared by all FP8 layers (its ``precision`` is unused).
        warmup_steps: Steps run fully in BF16 before FP8 switches on.
        clip_grad: Max global gradient norm, or None for no clipping.
        memory: Optimizer and weight-storage settings.
    """

    rules: tuple[Rule, ...] = ()
    default: Precision = DEFAULT_PRECISION
    recipe: LayerRecipe = field(default_factory=LayerRecipe)
    warmup_steps: int = 0
    clip_grad: float | None = None
    memory: MemoryKnobs = field(default_factory=MemoryKnobs)

    def precision_for(self, name: str, n_layers: int) -> Precision:
        """The precision of layer ``name`` (a unit or a Hugging Face name) in a model of ``n_layers`` blocks.

        Raises:
            PrecisionConflict: The Hugging Face names of ``name``'s unit resolve to different precisions.
        """
        chosen = member_rules(self.rules, name, n_layers)
        precisions = {m: r.precision if r else self.default for m, r in chosen.items()}
        if len(set(precisions.values())) > 1:
            listed = ", ".join(f"{m.rsplit('.', 1)[-1]}: {p.value}" for m, p in precisions.items())
            raise PrecisionConflict(f"{unit_of(name)} is one fused GEMM but the policy gives it {listed}; "
                                    "give q/k/v (and gate/up) one precision")
        return next(iter(precisions.values()))

    def layer_recipes(self, names: list[str], n_layers: int) -> dict[str, LayerRecipe]:
        """Recipe for each named layer."""
        return {n: replace(self.recipe, precision=self.precision_for(n, n_layers)) for n in names}

    @property
    def uses_fp8(self) -> bool:
        return self.default.is_fp8 or any(r.precision.is_fp8 for r in self.rules)

    def to_dict(self) -> dict[str, Any]:
        recipe = self.recipe.to_dict()
        recipe.pop("precision")
        return {
            "default": self.default.value,
            "rules": [r.to_dict() for r in self.rules],
            "recipe": recipe,
            "warmup_steps": self.warmup_steps,
            "clip_grad": self.clip_grad,
            "memory": self.memory.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Policy":
        return cls(
            rules=tuple(Rule.from_dict(r) for r in data.get("rules", [])),
            default=Precision(data.get("default", "bf16")),
            recipe=LayerRecipe(**data.get("recipe", {})),
            warmup_steps=int(data.get("warmup_steps", 0)),
            clip_grad=data.get("clip_grad"),
            memory=MemoryKnobs(**data.get("memory", {})),
        )

    @classmethod
    def bf16(cls, clip_grad: float | None = None, memory: MemoryKnobs | None = None) -> "Policy":
        """The all-BF16 reference policy."""
        return cls(clip_grad=clip_grad, memory=memory or MemoryKnobs())

    @classmethod
    def blocks_in(cls, recipe: LayerRecipe, clip_grad: float | None = None,
                  memory: MemoryKnobs | None = None) -> "Policy":
        """Every block Linear in ``recipe`` (its precision and settings), the output layer in the default precision
        (BF16), no warm-up: Megatron-Core's FP8 set-up with ``recipe`` its FP8 recipe."""
        return cls(rules=(Rule("blocks", (BLOCKS_PATTERN,), recipe.precision),), recipe=recipe, clip_grad=clip_grad,
                   memory=memory or MemoryKnobs())
