"""``damage``: the fixed-state reading (:mod:`precsearch.probe.damage` computes it), joined with the probe's
catastrophes.

Instability is the policy's quantization error at states of the BF16 run, in the figure
``objectives.damage.measure`` names, with a jackknife standard error; a trial is stable when it did not
diverge, had no loss spike or gradient blow-up beyond the reference's (what only dynamics shows), and reads
at most ``objectives.damage.limit``. The loss gaps are still reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from precsearch.readings.base import DIVERGED_INSTABILITY, Judged, SideRuns, StabilityReading, finite

#: What each fixed-state figure is, after its name (``docs/stability-reading.md`` has the table).
MEASURES: dict[str, str] = {
    "update_norm": "AdamW update error bias^2 / update^2",
    "grad_norm": "gradient error bias^2 / gradient^2",
    "grad_noise": "gradient error / SGD noise of a training step",
    "grad_bias_noise": "gradient bias / SGD noise of a training step",
    "grad_var_noise": "gradient error variance / SGD noise of a training step",
    "update_noise": "update error / SGD noise of a training step",
    "forward": "relative held-out loss change",
}


#: The states read when ``objectives.damage.states`` is not given: the middle and the end of the BF16 run, and,
#: when the probe starts from a checkpoint (``model.init_from``), the checkpoint itself. On SmolLM2's real weights
#: (H100, 2026-12-06; docs/results/real-weights.md) every policy whose fine-tuned loss gap was beyond the BF16 seed
#: noise (+0.6% to +2.2% after 100 steps) read stable at the middle and the end of a 30-step run, and unstable
#: with the checkpoint read too: a pretrained model's outliers meet FP8 at its first step.
DEFAULT_STATES: tuple[float, ...] = (0.5, 1.0)
CHECKPOINT_STATES: tuple[float, ...] = (0.0, 0.5, 1.0)


class DamageReading(StabilityReading):
    """Reads the probe result's fixed-state reading (``result.damage``: ``value``, ``se``, ``nonfinite``)."""

    name: ClassVar[str] = "damage"
    description: ClassVar[str] = "the fixed-state reading (objectives.damage) joined with the probe's catastrophes"
    own_unit: ClassVar[bool] = True
    fixed_states: ClassVar[bool] = True
    legacy_column: ClassVar[str] = "instability_sgd_noise"
    plot_subject: ClassVar[str] = "fixed-state damage"

    def judge(self, result: Any, objectives: Any, *, gap: float, tail: float, excess: int, floor: float) -> Judged:
        """A probe without a reading (it failed to read), or with a non-finite one, is unstable."""
        reading = result.damage or {}
        value, se = float(reading.get("value", math.nan)), float(reading.get("se", math.nan))
        if not math.isfinite(value) or reading.get("nonfinite"):
            return Judged(DIVERGED_INSTABILITY, DIVERGED_INSTABILITY, math.nan, value, se)
        catastrophe = DIVERGED_INSTABILITY if excess else -math.inf  # spikes BF16 did not have
        return Judged(value, max(value - objectives.damage.limit, catastrophe), gap, value, se)

    def from_checkpoint(self, objectives: Any) -> Any:
        """Read the checkpoint too (:data:`CHECKPOINT_STATES`), unless ``objectives.damage.states`` was written."""
        damage = objectives.damage
        if "states" in damage.model_fields_set:
            return objectives
        return objectives.model_copy(update={"damage": damage.model_copy(update={"states": list(CHECKPOINT_STATES)})})

    def limit(self, objectives: Mapping[str, Any]) -> float:
        limit = (objectives.get("damage") or {}).get("limit")
        return float(limit) if finite(limit) else math.nan

    def measure(self, objectives: Mapping[str, Any]) -> str:
        return (objectives.get("damage") or {}).get("measure") or "grad_noise"

    def row_measure(self, row: Mapping[str, Any]) -> str:
        return row.get("damage_measure", "")

    def unit_name(self, measure: str) -> str:
        what = MEASURES.get(measure)
        return f"{measure} ({what})" if what else (measure or "the fixed-state reading's measure")

    def standard_error(self, score: Mapping[str, Any]) -> float:
        se = score.get("damage_se", score.get("instability_se"))
        return float(se) if finite(se) else math.nan

    def metrics(self, score: Any) -> dict[str, float]:
        return {"damage": score.damage, "damage_se": score.damage_se}

    def verdict_figures(self, score: Any) -> str:
        """The reading itself is the line's instability: here the loss gap and the catastrophes."""
        words = "" if math.isfinite(score.damage) else "; damage not read (scored as unstable)"
        words += f"; loss gap {100 * score.loss_gap:+.2f}%"
        if score.spikes + score.grad_blowups:
            words += f"; {score.spikes + score.grad_blowups} loss spike(s)/blow-up(s) beyond BF16's"
        return words

    def infeasible_reason(self, shown: str) -> str:
        return (f"its fixed-state damage reads {shown} (objectives.damage.limit), or its probe had loss spikes or "
                f"gradient blow-ups BF16 did not")

    def standard_reference(self, objectives: Any) -> bool:
        return objectives.damage.standard_reference

    def side_runs(self, clip_values: Sequence[Any], steps: int) -> SideRuns:
        return FixedStateSides(clip_values, steps)

    def passes_per_state(self, objectives: Any) -> tuple[int, str] | None:
        """The warm-up passes (for delayed scaling's history) and the measured batches of each state; a kept
        model's scalers are reset between states (``Backend.reset_converted``)."""
        damage = objectives.damage
        return damage.warm_batches + damage.batches, "objectives.damage.warm_batches + batches"


class FixedStateSides(SideRuns):
    """The BF16 sides of one probe process (the BF16 run to its states and its gradients there), one per
    clipping value: the probe process makes one at the first trial of its value and keeps it."""

    def __init__(self, clip_values: Sequence[Any], steps: int):
        self._steps, self._made = steps, set()
        self._ahead = len(set(clip_values)) * steps

    def steps_ahead(self) -> int:
        return self._ahead

    def begin(self, clip_grad: Any, trial: int) -> str | None:
        if clip_grad in self._made:
            return None
        self._made.add(clip_grad)
        self._ahead = max(0, self._ahead - self._steps)
        return (f"trial {trial}: its fixed-state reading first makes the BF16 side for clip_grad={clip_grad} (the "
                f"BF16 run to its states and its gradients there), once per clip value; later trials' readings "
                f"reuse it")

    def seconds_in(self, result: Any) -> float:
        """The reader's ``bf16_side_s`` (:mod:`precsearch.probe.damage.reader`)."""
        return float((result.damage or {}).get("bf16_side_s", 0.0))
