"""A finished trial's MLflow run, built from its probe result: steps, plots, metrics, tags and artifacts.

:func:`log_trial` is what ``runtime/_tell.py`` calls once a trial is scored; the names of every
metric, tag and artifact of a trial's run are written here. Tracking imports no search: what the
search made of the trial arrives as :class:`SearchReading`, plain values and the score read by
attribute.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from precsearch.instability import Reading, number
from precsearch.policy import Policy
from precsearch.probe.result import ProbeResult
from precsearch.tracking.diagnostics_report import (
    diagnostics_artifacts,
    diagnostics_heatmap,
    diagnostics_metrics,
    diagnostics_tags,
)
from precsearch.tracking.damage_report import damage_artifacts, damage_metrics
from precsearch.tracking.memory_report import log_memory_breakdown
from precsearch.tracking.signals_report import trial_signals
from precsearch.tracking.trial_report import loss_curves, memory_table, policy_table


@dataclass(frozen=True)
class SearchReading:
    """What the search made of one trial, as its run shows it.

    Attributes:
        score: The trial's score (:class:`precsearch.search.scoring.Score`), read by attribute.
        verdict: Its one-word verdict (``search.scoring.verdict``).
        stability: Its stability metrics (``search.scoring.stability_metrics``).
        predicted: The sensitivity table's predictions for its params (empty without a table).
        stability_unit: ``objectives.stability_unit``.
        rung: The steps it ran (its fidelity rung).
        promoted_from: The trial it was promoted from, or ``-``.
        instability: Its instability in the study's one unit (:class:`precsearch.instability.Reading`), logged as
            the metric ``instability_in_unit`` and the tags ``instability_unit`` (the unit's name) and
            ``instability_band``; None leaves them out.
    """

    score: Any
    verdict: str
    stability: dict[str, float]
    predicted: dict[str, float]
    stability_unit: str
    rung: int
    promoted_from: str
    instability: Reading | None = None


def log_trial(tracker: Any, run_id: str, trial: Any, policy: Policy, n_layers: int, result: ProbeResult,
              stressed: ProbeResult | None, paired: ProbeResult, seeds: list[ProbeResult],
              reading: SearchReading, after_steps: Callable[[], None] = lambda: None,
              framework_memory: dict[str, Any] | None = None) -> None:
    """Log the trial's steps, plots and memory breakdown on ``run_id``, then finish the run with its
    metrics, tags and artifacts. ``after_steps`` is called once the per-step metrics are logged (the
    fault tests stop a record there). ``framework_memory``: the study's framework target's run of the policy
    (:func:`~precsearch.tracking.memory_report.framework_breakdown`), which the memory breakdown then shows."""
    tracker.log_steps(run_id, {"train_loss": result.losses, "grad_norm": result.grad_norms}
                      | ({"stress_train_loss": stressed.losses} if stressed else {}))
    after_steps()
    if (heatmap := diagnostics_heatmap(result)) is not None:
        tracker.log_bytes(run_id, heatmap, "diagnostics/heatmap.png")
    tracker.log_bytes(run_id, loss_curves(result, paired, f"trial {trial.number}:"), "loss_curves.png")
    memory = memory_table(result, paired)
    log_memory_breakdown(tracker, run_id, trial, result, paired, framework_memory)
    sig_metrics, sig_tags, sig_files, sig_plot = trial_signals(result.signals, paired.signals,
                                                               [r.signals for r in seeds])
    if sig_plot is not None:
        tracker.log_bytes(run_id, sig_plot, "signals/signals.png")
    tracker.finish_trial(
        run_id,
        metrics=trial_metrics(result, paired, len(seeds), reading) | sig_metrics | reading.predicted,
        tags=trial_tags(result, trial, reading) | sig_tags,
        artifacts=trial_artifacts(policy, n_layers, result, stressed, memory) | sig_files,
    )


def trial_metrics(result: ProbeResult, paired: ProbeResult, n_seeds: int, reading: SearchReading
                  ) -> dict[str, float]:
    """The run's metrics: the score's objectives and stability, the probe's figures, its diagnostics."""
    s, rung = reading.score, reading.rung
    return ({"memory_saved": s.memory_saved, "memory_saved_probe": s.memory_saved_probe,
             "memory_saved_target": s.memory_saved_target, "instability": s.instability, "loss_gap": s.loss_gap,
             "tokens_per_s": s.tokens_per_s, "speedup": s.speedup, "spikes": s.spikes,
             "peak_memory_mib": result.peak_memory_bytes / 2**20, "eval_loss": result.eval_loss,
             "reference_eval_loss": paired.eval_loss, "wall_s": result.wall_s,
             "steps_run": len(result.losses), "feasible": float(s.feasible), "diverged": float(s.diverged),
             "reference_seeds": n_seeds, "fidelity_steps": rung, "start_step": result.start_step}
            | ({"memory_saved_framework": s.memory_saved_framework} if s.memory_framework else {})
            | {k: v for k, v in (("tokens_per_s_se", s.tokens_per_s_se), ("speedup_se", s.speedup_se),
                                 ("speedup_probe", s.speedup_probe), ("speedup_framework", s.speedup_framework))
               if math.isfinite(v)}
            | reading.stability | diagnostics_metrics(result) | damage_metrics(result)
            | _in_unit(reading.instability))


def _speed_source(s: Any) -> str:
    """Where the score ``s``'s ``speedup`` comes from: the framework target's run, predicted; else the probe, and
    why."""
    if math.isfinite(s.speedup_framework):
        return f"{s.memory_framework}'s run, predicted (the probe's step with {s.memory_framework}'s optimizer step)"
    return f"the probe ({s.speedup_note})" if s.speedup_note else "the probe"


def _in_unit(instability: Reading | None) -> dict[str, float]:
    """``instability_in_unit`` as the terminal prints it (the study keeps the full value), and
    ``instability_vs_standard``, its multiple of the standard FP8 recipe's reading, as printed too; none if unknown."""
    if instability is None or instability.number == "-":
        return {}
    beside = {"instability_vs_standard": float(instability.multiple[:-1])} if instability.multiple != "-" else {}
    return {"instability_in_unit": float(instability.number)} | beside


def trial_tags(result: ProbeResult, trial: Any, reading: SearchReading) -> dict[str, str]:
    """The run's tags: state, verdicts, where the memory figure came from, the trial's lineage, diagnostics."""
    s, rung = reading.score, reading.rung
    return ({"trial_state": "COMPLETE", "feasible": str(s.feasible).lower(), "diverged": str(s.diverged).lower(),
             "memory_source": f"{s.memory_framework}'s run, predicted" if s.memory_framework
             else result.memory_source, "divergence_reason": result.reason or "-",
             "speed_source": _speed_source(s),
             "nonfinite": s.nonfinite or "-",
             "duplicate_of": str(trial.user_attrs.get("duplicate_of", "-")), "stable": str(s.stable).lower(),
             "stable_under_stress": "-" if s.stable_under_stress is None else str(s.stable_under_stress).lower(),
             "stability_unit": reading.stability_unit, "fidelity_steps": str(rung), "verdict": reading.verdict,
             "promoted_from": reading.promoted_from} | diagnostics_tags(result) | _unit_tags(reading.instability))


def _unit_tags(instability: Reading | None) -> dict[str, str]:
    """The unit ``instability_in_unit`` is in, its limit there, and the reading's band; where the study read the
    standard FP8 recipe, that recipe's reading (``instability_standard``) and what it ran (``standard_recipe``)."""
    if instability is None:
        return {}
    beside = {"instability_standard": number(instability.standard, instability.unit.limit),
              "standard_recipe": instability.standard_recipe} if instability.multiple != "-" else {}
    return {"instability_unit": instability.unit.name, "instability_limit": instability.unit.limit_text,
            "instability_band": instability.band} | beside


def trial_artifacts(policy: Policy, n_layers: int, result: ProbeResult, stressed: ProbeResult | None,
                    memory: str | None) -> dict[str, str]:
    """The run's text artifacts: the policy (YAML and table), the probe results, the memory table."""
    return ({"policy.yaml": yaml.safe_dump(policy.to_dict(), sort_keys=False),
             "policy.md": policy_table(policy, n_layers),
             "probe_result.json": json.dumps(result.to_dict(), indent=1)}
            | ({"memory.md": memory} if memory else {})
            | ({"stress_probe_result.json": json.dumps(stressed.to_dict(), indent=1)} if stressed else {})
            | diagnostics_artifacts(result) | damage_artifacts(result))
