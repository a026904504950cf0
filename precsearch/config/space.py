"""The search space file, as validated data.

A space file (YAML) has one section per concern; each section is a model
below with ``extra="forbid"``, so an unknown key is an error that names it.
Cross-field rules that need the whole file (a warm-up longer than the probe,
a group that matches no layer, a precision the backend cannot run) live in
:mod:`precsearch.config.checks`.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator

from precsearch.backends.registry import BACKEND_CHOICES
from precsearch.config.damage_section import DamageSection
from precsearch.config.data_source import FILE_SOURCES, DataSource
from precsearch.config.fidelity import FidelitySection
from precsearch.config.knob import Knob, knob
from precsearch.config.model_section import ModelSection
from precsearch.config.section import Section
from precsearch.config.target import TargetSection
from precsearch.config.unit_space import SensitivitySection, UnitSet
from precsearch.policy.rules import Fp8Attention, MemoryKnobs, Rule
from precsearch.storage import MasterDtype, MomentDtype, StateDtype
from precsearch.precision import BF16_RECIPE, LayerRecipe, Precision
from precsearch.recipes import DEFAULT_PRECISION, SETTINGS
from precsearch.readings.registry import DEFAULT_READING, READING_NAMES, get_reading
from precsearch.readings.registry import description as readings_description
from precsearch.utils.names import REFUSED, name_problem
from precsearch.utils.numbers import MAX_COUNT, MAX_SECONDS, MAX_SEED

#: The space file's ``objectives.reading``: a name of the readings' registry (:mod:`precsearch.readings`).
ReadingName = Literal[READING_NAMES]  # type: ignore[valid-type]


class DataSection(Section):
    """Where the probe's tokens come from."""

    source: DataSource = DataSource.STDLIB
    path: Path | None = None
    tokenizer: Path | None = None
    dtype: Literal["uint16", "uint32", "int32", "int64"] = "uint16"
    max_tokens: int | None = Field(None, gt=0, le=MAX_COUNT)
    field: str = Field("text", min_length=1, description="hf_disk: the column; jsonl: the key; holding a text "
                       "(tokenized) or a list of token ids")
    eval_batches: int = Field(4, gt=0, le=MAX_COUNT, description="held-out batches the loss gap is measured on")

    @model_validator(mode="after")
    def _path_needed(self) -> "DataSection":
        if self.source in FILE_SOURCES and self.path is None:
            raise ValueError(f"source '{self.source.value}' needs 'path'")
        return self


class ProbeSection(Section):
    """The short training run each trial makes."""

    steps: int = Field(60, gt=0, le=MAX_COUNT)
    micro_batch: int = Field(8, gt=0, le=MAX_COUNT)
    grad_accum: int = Field(1, ge=1, le=MAX_COUNT, description="micro-batches per optimizer step (gradient "
                            "accumulation): tokens per step = micro_batch x seq_len x grad_accum; the activation "
                            "peak is one micro-batch's")
    seq_len: int = Field(128, gt=1, le=MAX_COUNT)
    lr: float = Field(3e-3, gt=0)
    schedule: Literal["constant", "cosine"] = "cosine"
    lr_warmup_steps: int = Field(5, ge=0, le=MAX_COUNT, description="linear LR warm-up (not the FP8 warm-up)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    optimizer: Literal["adamw"] = "adamw"
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    param_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="parameter (and AdamW state) dtype; compute is BF16 autocast either way"
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="the probe's initial weights and data order")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    nproc: int = Field(
        1, ge=1, le=MAX_COUNT,
        description="processes per probe: one per GPU, or CPU processes; above 1 the probe is sharded "
        "with FSDP2 and micro_batch is the global batch, split evenly over them"
    )
    tp: int = Field(
        1, ge=1, le=MAX_COUNT,
        description="tensor-parallel size: each block's GEMMs split over tp of the nproc processes "
        "(Megatron's column/row split; TE tp_group); the nproc/tp groups shard with FSDP2 and split the batch"
    )
    sequence_parallel: bool = Field(
        True, description="with tp above 1, split the residual stream (norms, residuals) along the sequence "
        "between units, as Megatron's --sequence-parallel"
    )
    divergence_factor: float = Field(
        3.0, gt=1, description="loss above this multiple of the first loss counts as divergence"
    )
    spike_threshold: float = Field(
        0.25, gt=0, description="a step whose loss jumps this far (relative) above its running mean is a spike"
    )
    grad_blowup_factor: float = Field(
        10.0, gt=1, description="a gradient norm above this multiple of the recent median is a blow-up"
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        # AdamW divides by 1 - beta**step: beta 1 divides by zero, beyond 1 or below 0 the averages diverge
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"AdamW betas must each lie in [0, 1), got {list(v)}; e.g. [0.9, 0.95]")
        return v


BackendName = Enum("BackendName", {name.upper(): name for name in BACKEND_CHOICES}, type=str)
"""The space file's ``backend``: ``auto`` or a name of :data:`precsearch.backends.registry.BACKENDS`."""


class LayerSelector(Section):
    """Which transformer blocks a group covers (omit for all blocks)."""

    first: int | None = Field(None, ge=0, le=MAX_COUNT)
    last: int | None = Field(None, ge=0, le=MAX_COUNT)
    indices: list[Annotated[int, Field(ge=0, le=MAX_COUNT)]] | None = None



class Group(Section):
    """Linear layers that share one precision: name patterns, optionally limited to some blocks.

    Patterns are shell globs over fully qualified module names such as
    ``model.layers.3.self_attn.q_proj`` (``*`` crosses dots). Groups are tried
    in order; the first that matches a layer decides its precision.
    """

    name: str
    modules: list[str] = Field(min_length=1)
    layers: LayerSelector | None = None
    precision: knob(Precision) = Knob(fixed=DEFAULT_PRECISION)

    def to_rule(self, precision: Precision) -> Rule:
        """This group as a policy rule running ``precision``."""
        sel = self.layers
        return Rule(
            name=self.name,
            modules=tuple(self.modules),
            precision=precision,
            first=sel.first if sel else None,
            last=sel.last if sel else None,
            indices=tuple(sel.indices) if sel and sel.indices is not None else None,
        )

    @field_validator("name")
    @classmethod
    def _simple_name(cls, v: str) -> str:
        # a group name is an Optuna param and an MLflow param key (precision.<name>): MLflow keys take
        # word characters of any script, '.', '-', ' ', ':' and '/'; '_' joins words here
        if not re.fullmatch(r"\w+", v):
            raise ValueError(f"group name '{v}' may use letters (of any script), digits and '_' only")
        return v


def _recipe_knob(name: str) -> tuple[Any, Knob]:
    """A ``search.recipe`` knob for the :class:`LayerRecipe` field ``name``: its type, fixed at its default."""
    value_type = _RECIPE_TYPES[name]
    return knob(value_type, numeric=value_type is int), Knob(fixed=getattr(BF16_RECIPE, name))


_RECIPE_TYPES = get_type_hints(LayerRecipe)
RecipeSection = create_model(
    "RecipeSection", __base__=Section, __module__=__name__,
    **{name: _recipe_knob(name) for name in SETTINGS})
RecipeSection.__doc__ = """The recipe settings shared by every low-precision layer of a trial: one knob per field of
:class:`~precsearch.precision.LayerRecipe` (its docstring says what each does, and each recipe's ``settings``
which it reads), fixed at the field's default unless searched."""


class EdgeBlocksSection(Section):
    """Transformer blocks at each end kept whole in BF16, before any group is tried.

    Megatron's ``--first-last-layers-bf16 --num-layers-at-start-in-bf16 N
    --num-layers-at-end-in-bf16 M``; the NVFP4 paper keeps the last blocks in BF16.
    Counts are blocks of the model the policy runs on (the probe's, then the target's).
    """

    first: knob(int, numeric=True) = Knob(fixed=0)
    last: knob(int, numeric=True) = Knob(fixed=0)


class MemorySection(Section):
    """Optimizer and weight-storage knobs (backend ``te`` on a GPU; see :class:`~precsearch.policy.MemoryKnobs`)."""

    master_weights: knob(bool) = Knob(fixed=False)
    moment_dtype: knob(MomentDtype) = Knob(fixed="param")
    fp8_weights: knob(bool) = Knob(fixed=False)
    exp_avg_dtype: knob(StateDtype | None) = Knob(fixed=None)
    exp_avg_sq_dtype: knob(StateDtype | None) = Knob(fixed=None)
    master_dtype: knob(MasterDtype) = Knob(fixed="fp32")
    fp8_attention: knob(Fp8Attention) = Knob(fixed="off")


class SearchSection(Section):
    """What a trial chooses: per-group and per-unit precision, recipe, FP8 warm-up, gradient clipping."""

    default_precision: knob(Precision) = Knob(fixed=DEFAULT_PRECISION)
    groups: list[Group] = Field(default_factory=list)
    units: list[UnitSet] = Field(default_factory=list, description="per-module units, each with its own precision")
    sensitivity: SensitivitySection | None = Field(
        None, description="score each unit once and queue integer-program candidates first (off if unset)")
    recipe: RecipeSection = RecipeSection()
    bf16_blocks: EdgeBlocksSection = EdgeBlocksSection()
    warmup_steps: knob(int, numeric=True) = Knob(fixed=0)
    clip_grad: knob(float | None, numeric=True) = Knob(fixed=1.0)
    memory: MemorySection = MemorySection()
    allow_unsoaked: bool = Field(
        False, description="offer optimizer states and GEMM recipes no long paired run has passed "
        "(docs/results/soak.md); validate and run then warn once for each. Off: validate refuses them")

    def precisions(self) -> set[Precision]:
        """Every precision a trial of this space can give some layer."""
        knobs = [g.precision for g in self.groups] + [self.default_precision]
        return {p for k in knobs for p in k.options()}

    @field_validator("groups")
    @classmethod
    def _unique_names(cls, groups: list[Group]) -> list[Group]:
        names = [g.name for g in groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"group names must be unique; repeated: {', '.join(dupes)}")
        return groups


class BaselineMemory(Section):
    """How the BF16 reference run keeps its training state (what "memory saved" is measured against).

    The default is the standard mixed-precision set-up (Megatron-Core's and most Llama 3 recipes'):
    FP32 master weights and FP32 AdamW moments. With FP32 parameters it is plain AdamW (the master
    copy would equal the parameters), so a CPU probe with FP32 parameters runs it on any backend.
    """

    master_weights: bool = True
    moment_dtype: MomentDtype = "fp32"


#: The default stability limit in noise units: a loss gap within two BF16 seed spreads.
NOISE_LIMIT = 2.0


class StressSection(Section):
    """An optional second probe per trial at a higher learning rate, to surface fragility in few steps."""

    lr_multiplier: float | None = Field(None, gt=1, description="the stress probe's lr = probe.lr x this (off if unset)")
    in_constraint: bool = Field(False, description="a trial must also pass under stress to be feasible")

    @model_validator(mode="after")
    def _needs_multiplier(self) -> "StressSection":
        if self.in_constraint and self.lr_multiplier is None:
            raise ValueError("in_constraint needs lr_multiplier (the stress probe's learning-rate multiple, > 1)")
        return self


def instability_unit(reading: str, stability_unit: str) -> str:
    """What a study's instability is measured in: a reading's own unit (the fixed-state reading, in its measure)
    where it has one, else its ``stability_unit`` (read from a stored study's space too, whatever its version)."""
    return get_reading(reading).unit_kind(stability_unit)


class ObjectivesSection(Section):
    """What a trial is scored on."""

    memory: bool = Field(True, description="maximize memory saved vs BF16")
    memory_basis: Literal["target", "probe"] = Field(
        "target", description="memory saved on the target model (predicted, calibrated on a GPU) or on the probe"
    )
    instability: bool = Field(True, description="minimize the loss gap vs BF16")
    throughput: bool = Field(False, description="maximize tokens/s")
    stability_limit: float = Field(
        0.01, gt=0, description="feasible if instability <= this, in stability_unit (default 0.01, or 2.0 for noise)"
    )
    stability_unit: Literal["relative", "noise"] = Field(
        "relative", description="relative: a fraction of the BF16 loss; noise: multiples of the BF16 seed spread"
    )
    reference_seeds: int = Field(3, ge=1, le=MAX_COUNT,
        description="BF16 reference seeds; their spread is the noise floor")
    spike_penalty: float = Field(0.002, ge=0, description="added to instability per loss spike or gradient blow-up")
    reading: ReadingName = Field(DEFAULT_READING, description=readings_description())
    damage: DamageSection = DamageSection()
    tail_fraction: float = Field(0.25, gt=0, le=1, description="with reading 'tail': the last part of the run read")
    stress: StressSection = StressSection()
    baseline_memory: BaselineMemory = BaselineMemory()
    regime_check: Literal["warn", "refuse", "off"] = Field(
        "warn", description="before the first trial: is the BF16 reference smooth (no spikes, attention logits "
        "and block amax not running away)? warn, refuse (stop), or off (precsearch.probe.regime)")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys_and_unit_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "spike_threshold" in data:
            raise ValueError("spike_threshold moved to probe.spike_threshold (spikes are detected while the probe trains)")
        if isinstance(data, dict) and data.get("stability_unit") == "noise" and "stability_limit" not in data:
            data = {**data, "stability_limit": NOISE_LIMIT}
        return data

    @property
    def instability_unit(self) -> str:
        """What instability is measured in (:func:`instability_unit`)."""
        return instability_unit(self.reading, self.stability_unit)

    @property
    def instability_limit(self) -> float:
        """The stability limit in :attr:`instability_unit`."""
        return get_reading(self.reading).limit(self.model_dump())

    @model_validator(mode="after")
    def _at_least_two(self) -> "ObjectivesSection":
        if sum([self.memory, self.instability, self.throughput]) < 2:
            raise ValueError("enable at least two of memory, instability, throughput")
        return self

    @model_validator(mode="after")
    def _noise_needs_seeds(self) -> "ObjectivesSection":
        if self.stability_unit == "noise" and self.reference_seeds < 2:
            raise ValueError(f"stability_unit 'noise' needs reference_seeds >= 2 (got {self.reference_seeds}): "
                             f"one BF16 seed has no spread to measure; valid: reference_seeds >= 2, "
                             f"or stability_unit 'relative'")
        return self


class Sampler(str, Enum):
    TPE = "tpe"
    NSGA2 = "nsga2"
    GP = "gp"
    RANDOM = "random"




class StudySection(Section):
    """The Optuna study."""

    name: str = "precsearch"
    n_trials: int = Field(20, gt=0, le=MAX_COUNT)
    sampler: Sampler = Sampler.TPE
    seed: int = Field(0, ge=0, le=MAX_SEED, description="the sampler's seed")
    storage: str | None = Field(None, description="Optuna storage URL (default: sqlite in the output dir)")
    heartbeat_s: int = Field(
        10, gt=0, le=MAX_SECONDS,
        description="each worker records a heartbeat for its running trial this often (RDB storages)"
    )
    stale_after_s: int | None = Field(
        None, gt=0, le=MAX_SECONDS,
        description="a running trial without a heartbeat for this long is failed and retried "
        "(default: 3 x heartbeat_s)"
    )
    max_retries: int = Field(2, ge=0, le=MAX_COUNT, description="how many times a trial whose worker died is run again")
    trial_timeout_s: float | None = Field(None, gt=0, le=MAX_SECONDS,
        description="kill a probe that runs longer (default: no limit)")
    store_retry_s: float = Field(
        60.0, ge=0, le=MAX_SECONDS,
        description="keep retrying an unreachable Optuna database or MLflow server this long"
    )
    fidelity: FidelitySection | None = Field(
        None, description="rungs of longer probes the best policies continue to (off if unset)"
    )

    @field_validator("name")
    @classmethod
    def _usable_name(cls, v: str) -> str:
        # the name is a folder, an MLflow experiment and a quoted MLflow search value (precsearch.utils.names)
        problem = name_problem(v)
        if problem == name_problem(""):
            raise ValueError(f"the study name {problem}")
        if problem:
            raise ValueError(f"study name {v!r} {problem}; a name may use letters of any script, digits, spaces "
                             f"and punctuation, not {REFUSED}")
        return v

    @field_validator("stale_after_s")
    @classmethod
    def _stale_after_heartbeats(cls, v: int | None, info: ValidationInfo) -> int | None:
        beat = info.data.get("heartbeat_s")
        if v is not None and beat is not None and v <= beat:
            raise ValueError(f"{v} s is not longer than heartbeat_s ({beat} s): every running trial would be "
                             f"taken for dead and run again; valid: > {beat}, e.g. {3 * beat}")
        return v


#: MLflow's limit on an experiment name (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH).
MAX_EXPERIMENT_NAME = 500


class TrackingSection(Section):
    """MLflow tracking."""

    uri: str | None = Field(None, description="default: $MLFLOW_TRACKING_URI, else sqlite in the output dir")
    experiment: str | None = Field(None, description="default: the study name")

    @field_validator("experiment")
    @classmethod
    def _named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("the experiment name is empty; leave it out to use the study name")
        if v is not None and len(v) > MAX_EXPERIMENT_NAME:
            raise ValueError(f"the experiment name has {len(v)} characters; MLflow takes at most "
                             f"{MAX_EXPERIMENT_NAME}")
        return v


class Space(Section):
    """A whole space file."""

    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    probe: ProbeSection = ProbeSection()
    backend: BackendName = BackendName.AUTO
    search: SearchSection = SearchSection()
    objectives: ObjectivesSection = ObjectivesSection()
    study: StudySection = StudySection()
    tracking: TrackingSection = TrackingSection()
    target: TargetSection | None = Field(None, description="what trains with the policies (off if unset: "
                                         "every choice is offered)")

    @model_validator(mode="after")
    def _checkpoint_states(self) -> "Space":
        """A probe from a checkpoint: the reading decides what it reads there
        (:meth:`precsearch.readings.StabilityReading.from_checkpoint`; the fixed-state reading reads the checkpoint
        too, unless ``objectives.damage.states`` says otherwise)."""
        if self.model.init_from is not None:
            objectives = get_reading(self.objectives.reading).from_checkpoint(self.objectives)
            object.__setattr__(self, "objectives", objectives)  # frozen: set once, here
        return self

    def baseline_knobs(self) -> MemoryKnobs:
        """The reference run's memory knobs (``objectives.baseline_memory``), resolved for the probe's parameters."""
        return MemoryKnobs(**self.objectives.baseline_memory.model_dump()).resolved(self.probe.param_dtype)


def stored_baseline_knobs(space: dict[str, Any]) -> MemoryKnobs:
    """:meth:`Space.baseline_knobs` of a space as a study stored it (``model_dump(mode="json")``); a study stored
    before ``objectives.baseline_memory`` existed gets its default."""
    stored = (space.get("objectives") or {}).get("baseline_memory") or {}
    param_dtype = ProbeSection(**space["probe"]).param_dtype
    return MemoryKnobs(**BaselineMemory(**stored).model_dump()).resolved(param_dtype)
