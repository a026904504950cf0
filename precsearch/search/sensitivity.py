"""The sensitivity table: for each searched unit x precision, its predicted loss, memory and speed effect.

* **loss** (``predicted_instability``): the estimator's score when only that
  unit changes (:mod:`precsearch.probe.measure.sensitivity`), clipped at 0 the way the
  study's instability is (a lead over BF16 counts as none); ``forward`` scores
  are relative loss changes, the unit of ``instability``; ``taylor`` scores are
  diagonal-Fisher values, comparable between units but not a loss.
* **memory** (``memory_saved``): the memory model's peak with only that unit
  switched, as the fraction of the BF16 peak it saves, on the model the space
  scores memory on (``objectives.memory_basis``). The model is additive over
  units up to the max() between the backward and optimizer-step peaks.
* **speed** (``speed_gain``): *predicted*, never measured here: the unit's share
  of the step's GEMM FLOPs times the saving of a nominal 2x faster FP8 GEMM
  (4x for NVFP4, Blackwell's FP4 rate).
  ``gpu_sensitivity_study.sh@d3ca7bc`` measures per-unit GEMM times on the H200.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from precsearch.arch.units import unit_names, unit_shape
from precsearch.config.space import Space
from precsearch.config.unit_space import SearchedUnit, searched_units
from precsearch.policy import MemoryKnobs
from precsearch.precision import LayerRecipe, Precision
from precsearch.recipes import SETTINGS
from precsearch.precision_spec import SPECS
from precsearch.probe.data import TokenBatches
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.measure.sensitivity import train_bf16, unit_scores



@dataclass(frozen=True)
class UnitEffect:
    """One unit x precision: what switching only that unit predicts."""

    unit: str
    param: str
    precision: str
    predicted_instability: float
    raw_score: float
    memory_saved: float
    speed_gain: float


@dataclass
class SensitivityTable:
    """Every searched unit x precision of a space, with how it was measured."""

    estimator: str
    rows: list[UnitEffect]
    wall_s: float
    speed_source: str = "predicted (GEMM FLOP share x nominal GEMM rate: 2x FP8/MXFP8, 4x NVFP4)"

    def effect(self, param: str, precision: str) -> UnitEffect | None:
        """The row of unit param ``param`` (``precision.L3.linear_fc1``) in ``precision`` (its value), or None."""
        return next((r for r in self.rows if r.param == param and r.precision == precision), None)

    def to_dict(self) -> dict:
        """Plain data (JSON-safe up to non-finite scores), as stored in the study's ``sensitivity`` user attr."""
        return {"estimator": self.estimator, "wall_s": self.wall_s, "speed_source": self.speed_source,
                "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict) -> "SensitivityTable":
        """The table :meth:`to_dict` wrote."""
        return cls(data["estimator"], [UnitEffect(**r) for r in data["rows"]], data["wall_s"], data["speed_source"])


def memory_basis(space: Space) -> ModelConfig:
    """The model memory saved is scored on: the target, or the probe."""
    return space.model.target() if space.objectives.memory_basis == "target" else space.model.probe()


def memory_effect(space: Space, unit: str, precision: Precision) -> float:
    """Fraction of the BF16 peak saved when only ``unit`` runs ``precision`` (memory model)."""
    cfg = memory_basis(space)
    knobs = MemoryKnobs(**space.objectives.baseline_memory.model_dump())
    kwargs = dict(seq_len=space.probe.seq_len, micro_batch=space.probe.micro_batch,
                  param_dtype=space.probe.param_dtype, memory=knobs, grad_accum=space.probe.grad_accum)
    base = predict_peak(cfg, {}, **kwargs).total
    return 1.0 - predict_peak(cfg, {unit: precision}, **kwargs).total / base


def speed_effect(cfg: ModelConfig, unit: str, precision: Precision) -> float:
    """Predicted fraction of GEMM time saved by running ``unit`` in ``precision`` (FLOP share, nominal rate:
    :attr:`~precsearch.precision_spec.PrecisionSpec.gemm_speedup`)."""
    if not precision.is_fp8:
        return 0.0
    flops = {u: math.prod(unit_shape(cfg, u)) for u in unit_names(cfg)}
    rate = SPECS[precision].gemm_speedup
    return flops[unit] / sum(flops.values()) * (1.0 - 1.0 / rate)


def measure(space: Space, data: TokenBatches, device: torch.device) -> SensitivityTable:
    """Train the BF16 probe once and score every searched unit x low precision of ``space``.

    Searched recipe settings and clipping take their first choice (the pass runs before any trial).
    """
    sens = space.search.sensitivity
    if sens is None:
        raise ValueError("the space has no search.sensitivity section")
    start = time.perf_counter()
    cfg = space.model.probe()
    units = [u for u in searched_units(space.search.units, cfg.n_layers) if not u.knob.is_fixed]
    clip = space.search.clip_grad.options()[0]
    model = train_bf16(cfg, space.probe, data, device, clip)
    precisions = sorted({p for u in units for p in u.knob.options()}, key=list(Precision).index)
    recipe = first_recipe(space)
    batches = data.eval_set()[: sens.eval_batches]
    scores = unit_scores(sens.estimator, model, [u.unit for u in units], precisions, recipe, batches, device)
    del model
    if device.type == "cuda":  # the probes run in another process: give the memory back
        torch.cuda.empty_cache()
    rows = [_row(space, cfg, u, p, scores) for u in units for p in u.knob.options()]
    return SensitivityTable(sens.estimator, rows, time.perf_counter() - start)


def first_recipe(space: Space) -> LayerRecipe:
    """The recipe the pass scores with: each ``search.recipe`` setting at its first choice, NVFP4 switches included."""
    return LayerRecipe(**{k: getattr(space.search.recipe, k).options()[0] for k in SETTINGS})


def _row(space: Space, cfg: ModelConfig, unit: SearchedUnit, precision: Precision,
         scores: dict[tuple[str, Precision], float]) -> UnitEffect:
    raw = scores[unit.unit, precision] if precision.is_fp8 else 0.0
    return UnitEffect(unit=unit.unit, param=unit.param, precision=precision.value,
                      predicted_instability=max(raw, 0.0), raw_score=raw,
                      memory_saved=memory_effect(space, unit.unit, precision) if precision.is_fp8 else 0.0,
                      speed_gain=speed_effect(cfg, unit.unit, precision))


def predict(table: SensitivityTable, params: dict[str, object]) -> tuple[float, float, float]:
    """``(instability, memory saved, GEMM time saved)`` predicted for a trial's unit params: sums over its units."""
    instability = memory = speed = 0.0
    for param, value in params.items():
        effect = table.effect(param, str(getattr(value, "value", value)))
        if effect is not None:
            instability += effect.predicted_instability
            memory += effect.memory_saved
            speed += effect.speed_gain
    return instability, memory, speed
