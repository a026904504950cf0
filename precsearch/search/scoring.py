"""Scoring a probe against its paired BF16 reference, in units of the BF16 seed noise.

* memory saved = 1 - peak(policy) / peak(BF16 reference), on the probe (measured
  on a GPU) and on the target model (predicted, calibrated by the probe on a
  GPU); ``objectives.memory_basis`` picks the one optimised. A space whose
  ``target:`` is a framework optimises what that framework's run of the policy
  saves instead (predicted by the memory model with the framework's rules, on
  the same basis: :mod:`precsearch.runtime.target_memory`), the figure its
  user gets; precsearch's own figures are kept beside it;
* loss gap = (eval loss(policy) - eval loss(reference)) / eval loss(reference),
  on the fixed held-out batches, not the noisy training batches; the reference
  is the BF16 probe of the same seed (paired);
* noise floor = the spread of the BF16 references over ``reference_seeds``
  seeds: sample standard deviation of their held-out losses / their mean
  (NaN, unknown, with one seed); gap in noise = loss gap / noise floor;
* tail gap = mean training loss(policy) / mean training loss(reference) - 1
  over the last ``objectives.tail_fraction`` of the steps (at least one step).
  The two runs see the same batch at every step, so the ratio is paired and
  batch difficulty cancels; averaging a window, not one point, lowers the noise;
* the **reading** (``objectives.reading``, a :class:`~precsearch.readings.StabilityReading`)
  picks the signed gap instability is read from (``instability_gap``) and the loss
  whose seed spread is the noise floor: ``final`` (default, as before) the held-out
  loss gap, ``tail`` the tail gap (and the seeds' spread of their tail-mean
  training loss, so gap and floor are in the same units);
* instability = max(instability gap, 0) + spike_penalty x (loss spikes and
  gradient blow-ups beyond the reference's, from the probe's per-step events); a
  diverged probe scores :data:`DIVERGED_INSTABILITY`. A negative gap (the policy
  ahead of BF16) counts as 0, never as "more stable than BF16": early in a run
  a lead mostly says the loss fell faster in the first steps, and it would
  otherwise hide damage of the same size. The signed gap is still reported
  (``loss_gap``, ``tail_gap``, ``gap_in_noise``);
* reference tail descent = how much the BF16 reference's training loss still
  falls across the tail window (mean of its first half / mean of its second
  half - 1): near 0 the window is past the early descent; a few percent means
  the verdict is still read in the transient, where only a longer rung helps;
* stable = not diverged and instability <= the stability limit, read in
  ``stability_unit``: ``relative`` compares instability itself, ``noise``
  compares instability / noise floor;
* with reading ``damage`` (:mod:`precsearch.readings.damage`) the instability is the fixed-state reading instead
  (:mod:`precsearch.probe.damage`: the policy's quantization error at states of
  the BF16 run, in units of the minibatch gradient noise of the training run's
  tokens per step), and stable means: not diverged, no loss spike or gradient
  blow-up beyond the reference's (what only dynamics shows), and the reading at
  most ``objectives.damage.limit``. The loss gaps are still reported;
* under stress (``objectives.stress``), the same figures for the policy and
  the BF16 reference both run at a higher learning rate; the stressed gap is
  read against the noise floor measured at the base learning rate;
* feasible = stable, and also stable under stress when ``stress.in_constraint``;
* a non-finite value anywhere (the loss, a gradient, an optimizer state or a
  weight of the probe: :mod:`precsearch.probe.measure.nonfinite`; the policy's
  gradient or update at a state of the damage reading) makes the trial
  infeasible whatever its figures, and ``nonfinite`` names it
  (``non-finite at step 12 in decoder.layers.1.mlp.linear_fc1.weight exp_avg_sq``).

Instability stays in relative units whatever ``stability_unit`` is: it is an
Optuna objective, and the noise floor differs between references (one per
gradient-clipping value), so noise units would not compare across trials.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from precsearch.config.space import ObjectivesSection
from precsearch.instability import INTERVAL_SE, Reading, StudyUnit
from precsearch.probe.framework_step import FrameworkSpeed
from precsearch.probe.measure.events import count_events
from precsearch.probe.measure.nonfinite import NonFinite
from precsearch.probe.result import ProbeResult
# DIVERGED_INSTABILITY, noise_text and the tail window's helpers are the readings'; re-exported for this module's users
from precsearch.readings import DEFAULT_READING, DIVERGED_INSTABILITY, get_reading, noise_text  # noqa: F401
from precsearch.readings.tail import TRANSIENT_DESCENT, tail_mean, tail_window  # noqa: F401


@dataclass(frozen=True)
class Score:
    """A trial's objectives and the figures behind them.

    ``stress_*`` and ``stable_under_stress`` are None when no stress probe ran.
    ``constraint`` is Optuna's constraint value: <= 0 exactly when ``feasible``.
    ``memory_saved`` is ``memory_saved_target`` or ``memory_saved_probe``, as
    ``objectives.memory_basis`` says, or, for a study whose ``target:`` is a framework (named in
    ``memory_framework``), ``memory_saved_framework``: what that framework's run of the policy saves, predicted. ``loss_gap`` is always the held-out gap and
    ``tail_gap`` the paired training-loss gap over the tail; ``instability_gap`` is
    the one of them ``reading`` names, the signed figure instability is read from.
    """

    memory_saved: float
    memory_saved_probe: float
    memory_saved_target: float
    loss_gap: float
    instability: float
    spikes: int
    grad_blowups: int
    diverged: bool
    tokens_per_s: float
    speedup: float
    noise_floor: float
    gap_in_noise: float
    stable: bool
    stress_loss_gap: float | None
    stress_instability: float | None
    stress_diverged: bool | None
    stable_under_stress: bool | None
    feasible: bool
    constraint: float
    reading: str = DEFAULT_READING
    tail_gap: float = math.nan
    instability_gap: float = math.nan
    reference_tail_descent: float = math.nan
    damage: float = math.nan
    damage_se: float = math.nan
    damage_measure: str = ""
    nonfinite: str = ""  # the first non-finite value of the probe or its reading, in words; "" if none
    stress_nonfinite: str = ""  # the same of the stress probe
    # the standard FP8 recipe's reading at the same states and clip value, what it is, and this reading's multiple of
    # it (NaN, "" where the study read none, or either reading is not a finite figure)
    instability_standard: float = math.nan
    standard_recipe: str = ""
    instability_vs_standard: float = math.nan
    # what the study's framework target saves running the policy (predicted), and which framework; NaN, "" without one
    memory_saved_framework: float = math.nan
    memory_framework: str = ""
    # standard errors of tokens_per_s (its own steps) and of speedup (the trial's and its reference's steps); NaN
    # where a run timed too few steps or was stored before (precsearch.probe.measure.step_rate says what they cover)
    tokens_per_s_se: float = math.nan
    speedup_se: float = math.nan
    # the probe's own speed-up (NaN where stored before it was kept apart); the study's framework target's, predicted
    # (precsearch.probe.framework_step), which ``speedup`` then is, NaN where none was; why none was, for a study with
    # a framework target ("" otherwise)
    speedup_probe: float = math.nan
    speedup_framework: float = math.nan
    speedup_note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Score":
        """The score :meth:`to_dict` stored (a trial's user attribute ``score``); a field stored by a later
        version is left out, one added since a study was stored takes its default."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class _Pair:
    """A probe read against its BF16 reference: the stability figures of one learning rate."""

    loss_gap: float
    instability: float
    spikes: int
    grad_blowups: int
    diverged: bool
    constraint: float
    tail_gap: float = math.nan
    read_gap: float = math.nan
    damage: float = math.nan
    damage_se: float = math.nan


def measure_noise_floor(references: Sequence[ProbeResult], reading: str = DEFAULT_READING,
                        tail_fraction: float = 0.25) -> float:
    """Seed-to-seed spread of BF16 losses, relative to their mean; NaN with fewer than 2.

    The losses are those the named reading reads (:meth:`~precsearch.readings.StabilityReading.noise_losses`:
    the held-out losses, or for ``tail`` the tail-mean training losses over the last ``tail_fraction``).
    """
    return get_reading(reading).noise_floor(references, tail_fraction)


def tail_gap(result: ProbeResult, reference: ProbeResult, fraction: float) -> float:
    """Paired training-loss gap over the tail window of the steps both ran; NaN if either is not finite."""
    steps = min(len(result.losses), len(reference.losses))
    policy, base = tail_mean(result.losses, fraction, steps), tail_mean(reference.losses, fraction, steps)
    if not (math.isfinite(policy) and math.isfinite(base)) or base == 0:
        return math.nan
    return policy / base - 1


def tail_descent(reference: ProbeResult, fraction: float) -> float:
    """How much ``reference``'s loss still falls across its tail window: mean(first half) / mean(second half) - 1."""
    window = reference.losses[len(reference.losses) - tail_window(len(reference.losses), fraction):]
    if len(window) < 2:
        return math.nan
    half = len(window) // 2
    return statistics.fmean(window[:half]) / statistics.fmean(window[half:]) - 1


def in_noise_units(value: float, floor: float) -> float:
    """``value`` (a relative loss figure) in multiples of the noise floor; NaN if the floor is unknown or 0."""
    return value / floor if floor > 0 else math.nan


def score(result: ProbeResult, reference: ProbeResult, objectives: ObjectivesSection, *,
          noise_floor: float = math.nan, stress: tuple[ProbeResult, ProbeResult] | None = None,
          standard: Mapping[str, Any] | None = None, framework: tuple[str, float] | None = None,
          framework_speed: FrameworkSpeed | None = None) -> Score:
    """Score ``result`` against the BF16 ``reference`` run on the same data, seed and steps.

    Args:
        result: The policy's probe.
        reference: The BF16 probe of the same seed.
        objectives: The space's objectives (limit, unit, spike penalty, stress settings).
        noise_floor: The BF16 seed spread (see :func:`measure_noise_floor`); NaN when unknown.
        stress: ``(policy probe, BF16 probe)`` at the stress learning rate, if one ran.
        standard: The standard FP8 recipe's fixed-state reading at the same clip value (``value``, ``recipe``;
            :mod:`precsearch.probe.damage.standard`), or None: the score then carries no multiple of it.
        framework: ``(name, saved)``: the study's framework target and what its run of the policy saves
            (:func:`~precsearch.runtime.target_memory.study_target_saving`), the memory objective then; None: the
            probe's figure on ``objectives.memory_basis``.
        framework_speed: The study's framework target's speed-up, predicted
            (:func:`~precsearch.runtime.target_speed.study_target_speed`): ``speedup`` where it has one, the
            probe's beside it in ``speedup_probe``; its ``why_not`` otherwise. None: the probe's speed-up.
    """
    base = _pair(result, reference, objectives, noise_floor)
    pressed = _pair(*stress, objectives, noise_floor) if stress else None
    counted = pressed is not None and objectives.stress.in_constraint
    constraint = max(base.constraint, pressed.constraint) if counted else base.constraint
    saved_probe, saved_target = memory_saved(result, reference)
    speedup_probe = result.tokens_per_s / reference.tokens_per_s if reference.tokens_per_s else 0.0
    predicted = framework_speed.speedup if framework_speed is not None else math.nan
    speedup = predicted if math.isfinite(predicted) else speedup_probe
    if objectives.memory_basis == "target" and math.isnan(saved_target):
        raise ValueError("a probe result has no target memory prediction (target_memory_bytes; it was stored "
                         "before precsearch predicted one): run it again, or set objectives.memory_basis: probe")
    return Score(
        reading=objectives.reading,
        tail_gap=base.tail_gap,
        instability_gap=base.read_gap,
        reference_tail_descent=tail_descent(reference, objectives.tail_fraction),
        damage=base.damage,
        damage_se=base.damage_se,
        damage_measure=get_reading(objectives.reading).measure(objectives.model_dump()),
        memory_saved=framework[1] if framework else saved_target if objectives.memory_basis == "target"
        else saved_probe,
        memory_saved_framework=framework[1] if framework else math.nan,
        memory_framework=framework[0] if framework else "",
        memory_saved_probe=saved_probe,
        memory_saved_target=saved_target,
        loss_gap=base.loss_gap,
        instability=base.instability,
        spikes=base.spikes,
        grad_blowups=base.grad_blowups,
        diverged=base.diverged,
        tokens_per_s=result.tokens_per_s,
        speedup=speedup,
        **_speed_errors(result, reference, speedup),
        speedup_probe=speedup_probe,
        speedup_framework=predicted,
        speedup_note=framework_speed.why_not if framework_speed is not None else "",
        noise_floor=noise_floor,
        gap_in_noise=in_noise_units(base.read_gap, noise_floor),
        stable=base.constraint <= 0,
        stress_loss_gap=pressed.loss_gap if pressed else None,
        stress_instability=pressed.instability if pressed else None,
        stress_diverged=pressed.diverged if pressed else None,
        stable_under_stress=pressed.constraint <= 0 if pressed else None,
        feasible=constraint <= 0,
        constraint=constraint,
        nonfinite=nonfinite_text(result),
        stress_nonfinite=nonfinite_text(stress[0]) if stress else "",
        **_beside_standard(base, result, standard),
    )


def _speed_errors(result: ProbeResult, reference: ProbeResult, speedup: float) -> dict[str, float]:
    """The standard errors of ``tokens_per_s`` and ``speedup`` from each run's relative one (independent runs:
    the relative errors of a ratio add in quadrature); NaN where either run has none, or no speed-up was measured."""
    mine, theirs = result.tokens_per_s_rel_se, reference.tokens_per_s_rel_se
    rate, ratio = result.tokens_per_s * mine, (speedup or math.nan) * math.hypot(mine, theirs)
    return {"tokens_per_s_se": rate if math.isfinite(rate) else math.nan,  # one NaN: stored scores compare equal
            "speedup_se": ratio if math.isfinite(ratio) else math.nan}


def _beside_standard(base: _Pair, result: ProbeResult, standard: Mapping[str, Any] | None) -> dict[str, Any]:
    """The standard recipe's reading, what it is, and the trial's reading as a multiple of it: none where either is
    not a finite figure (a diverged probe, a reading that failed or saw a non-finite value, a standard of 0)."""
    value = float((standard or {}).get("value", math.nan))
    if not math.isfinite(value) or (standard or {}).get("nonfinite"):
        return {}
    mine = base.damage if not base.diverged and not nonfinite_text(result) else math.nan
    ratio = mine / value if math.isfinite(mine) and value > 0 else math.nan
    return {"instability_standard": value, "standard_recipe": str(standard.get("recipe", "")),
            "instability_vs_standard": ratio}


def nonfinite_text(result: ProbeResult) -> str:
    """The probe's first non-finite value in words, else its damage reading's, else ``""``."""
    found = result.nonfinite or (result.damage or {}).get("nonfinite")
    return NonFinite.from_dict(found).describe() if found else ""


def memory_saved(result: ProbeResult, reference: ProbeResult) -> tuple[float, float]:
    """``(on the probe, on the target)``: 1 - peak(policy) / peak(BF16 reference), for each model.

    The target figure is NaN when either result has no target prediction (one
    stored before precsearch predicted it).
    """
    probe = 1.0 - result.peak_memory_bytes / reference.peak_memory_bytes
    if result.target_memory_bytes <= 0 or reference.target_memory_bytes <= 0:
        return probe, math.nan
    return probe, 1.0 - result.target_memory_bytes / reference.target_memory_bytes


def _pair(result: ProbeResult, reference: ProbeResult, objectives: ObjectivesSection, floor: float) -> _Pair:
    spikes = _excess(result, reference, "loss_spike")
    blowups = _excess(result, reference, "grad_blowup")
    diverged = result.diverged or not math.isfinite(result.eval_loss)
    if diverged:
        return _Pair(math.nan, DIVERGED_INSTABILITY, spikes, blowups, True, DIVERGED_INSTABILITY)
    gap = (result.eval_loss - reference.eval_loss) / reference.eval_loss
    tail = tail_gap(result, reference, objectives.tail_fraction)
    # a lead over BF16 counts as 0 (see the module docstring); the reading says what is read, and in what unit
    judged = get_reading(objectives.reading).judge(result, objectives, gap=gap, tail=tail, excess=spikes + blowups,
                                                   floor=floor)
    return _Pair(gap, judged.instability, spikes, blowups, False, judged.constraint, tail, judged.read_gap,
                 judged.value, judged.se)


def _excess(result: ProbeResult, reference: ProbeResult, kind: str) -> int:
    return max(0, count_events(result.events, kind) - count_events(reference.events, kind))


def objective_names(objectives: ObjectivesSection) -> list[str]:
    """The enabled objectives, in the order the study reports them."""
    names = [("memory_saved", objectives.memory), ("instability", objectives.instability),
             ("tokens_per_s", objectives.throughput)]
    return [n for n, on in names if on]


DIRECTIONS = {"memory_saved": "maximize", "instability": "minimize", "tokens_per_s": "maximize"}


def objective_values(s: Score, objectives: ObjectivesSection) -> list[float]:
    """The values Optuna optimises, in :func:`objective_names` order."""
    return [float(getattr(s, n)) for n in objective_names(objectives)]


def constraint_value(s: Score) -> float:
    """<= 0 when feasible (Optuna's convention); positive for a diverged probe in any unit."""
    return s.constraint


def stability_metrics(s: Score) -> dict[str, float]:
    """The noise and stress figures of ``s`` as MLflow metrics (stress ones only when a stress probe ran)."""
    metrics = {"noise_floor": s.noise_floor, "gap_in_noise": s.gap_in_noise, "grad_blowups": s.grad_blowups,
               "stable": float(s.stable), "constraint": s.constraint, "tail_gap": s.tail_gap,
               "instability_gap": s.instability_gap, "reference_tail_descent": s.reference_tail_descent}
    metrics |= get_reading(s.reading).metrics(s)
    if s.stable_under_stress is not None:
        metrics |= {"stress_loss_gap": s.stress_loss_gap, "stress_instability": s.stress_instability,
                    "stress_diverged": float(s.stress_diverged), "stable_under_stress": float(s.stable_under_stress)}
    return metrics


def verdict(s: Score) -> str:
    """The trial's verdict in words: ``feasible``, ``unstable`` or ``diverged``, with the gap, the noise floor
    it is read against, and stress (``unstable; gap +3.10% vs BF16 seed noise 0.80% (+3.9x)``); a non-finite
    value instead of the figures (``diverged; non-finite at step 12 in NAME exp_avg_sq``)."""
    words = "diverged" if s.diverged else ("feasible" if s.feasible else "unstable")
    if s.nonfinite:  # infeasible whatever the figures: they are not worth showing
        words = f"{'diverged' if s.diverged else 'infeasible'}; {s.nonfinite}"
    elif not s.diverged:  # the reading's figures: the gap against the noise floor, or its own measure's
        words += get_reading(s.reading).verdict_figures(s)
    if s.stable_under_stress is not None:
        under = "diverged" if s.stress_diverged else ("stable" if s.stable_under_stress else "unstable")
        under += f" ({s.stress_nonfinite})" if s.stress_nonfinite else ""
        words += f"; under stress: {under}"
    return words


def instability_reading(s: Score, objectives: ObjectivesSection) -> Reading:
    """The trial's instability in its study's one unit (:mod:`precsearch.instability`), as every output shows it."""
    return StudyUnit.of(objectives.model_dump()).read(s.to_dict())


def instability_text(s: Score, objectives: ObjectivesSection) -> str:
    """The instability in the study's unit, with its limit and band: ``1.98 BF16 seed spreads; limit 2: near the
    limit``, ``0.00138 ± 0.00062 (2 SE) update_norm (...); limit 0.01: stable``."""
    return instability_reading(s, objectives).text()


def speed_text(s: Score) -> str:
    """The trial's speed-up over its BF16 reference with ± 2 standard errors where both runs timed enough steps:
    ``speed-up 1.07x ± 0.02``, else ``speed-up 1.07x``; ``speed-up not measured`` without a reference rate. Where
    it is the study's framework target's, predicted: ``speed-up 1.18x ± 0.02 in megatron, predicted (the probe:
    1.06x)``; where a framework target's was not predicted: ``speed-up 1.07x (the probe's)``."""
    if not s.speedup:
        return "speed-up not measured"
    half = INTERVAL_SE * s.speedup_se
    text = f"speed-up {s.speedup:.2f}x" + (f" ± {half:.2f}" if math.isfinite(half) else "")
    if math.isfinite(s.speedup_framework):
        text += f" in {s.memory_framework or 'the target'}, predicted (the probe: {s.speedup_probe:.2f}x)"
    elif s.speedup_note:  # a framework target whose speed-up was not predicted: the front's table says why
        text += " (the probe's)"
    return text


def verdict_line(s: Score, objectives: ObjectivesSection) -> str:
    """The trial's verdict as the terminal and its MLflow tag ``verdict`` show it:
    ``instability 1.98 BF16 seed spreads; limit 2: near the limit [feasible; gap +2.47% vs ...]``."""
    return f"instability {instability_text(s, objectives)} [{verdict(s)}]"
