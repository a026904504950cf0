"""Telling a trial: its score, MLflow run (metrics, tags, artifacts) and Optuna values, then the front.

The tell half of the loop in :mod:`precsearch.runtime._optimize` (as optuna keeps ``study/_tell.py``).
"""

from __future__ import annotations

import json

import optuna
import yaml

from precsearch.policy import Policy
from precsearch.probe.result import ProbeResult
from precsearch.runtime.front_update import update_front
from precsearch.runtime.reference import References
from precsearch.runtime.study_log import say
from precsearch.runtime.session import StudyRun
from precsearch.search import guided, promotion
from precsearch.search.front import policy_summary
from precsearch.search.scoring import (
    constraint_value,
    objective_values,
    score,
    stability_metrics,
    verdict,
)
from precsearch.tracking.diagnostics_report import (
    diagnostics_artifacts,
    diagnostics_heatmap,
    diagnostics_metrics,
    diagnostics_tags,
)
from precsearch.tracking.signals_report import trial_signals
from precsearch.tracking.memory_report import log_memory_breakdown
from precsearch.tracking.trial_report import loss_curves, memory_table, policy_table
from precsearch.utils.retry import with_retry


def record(ctx: StudyRun, trial: optuna.Trial, run_id: str, policy: Policy, result: ProbeResult,
            references: References, stressed: ProbeResult | None, rung: int) -> None:
    objectives = ctx.space.objectives
    s = score(result, references.paired, objectives, noise_floor=references.noise_floor_in(objectives),
              stress=(stressed, references.stress) if stressed else None)
    for key, value in (("score", s.to_dict()), ("policy", policy.to_dict()), ("eval_loss", result.eval_loss),
                       ("peak_memory_bytes", result.peak_memory_bytes), ("memory_source", result.memory_source),
                       ("reason", result.reason), ("probe_result", result.to_dict())):
        trial.set_user_attr(key, value)
    if stressed:
        trial.set_user_attr("stress_result", stressed.to_dict())
    trial.set_constraint("stability", constraint_value(s))
    # MLflow first, Optuna second: a kill in between leaves the trial RUNNING in Optuna, which the
    # next run marks interrupted (and its MLflow run KILLED); the other order would leave a
    # COMPLETE trial whose MLflow run never finished.
    ctx.tracker.log_steps(run_id, {"train_loss": result.losses, "grad_norm": result.grad_norms}
                          | ({"stress_train_loss": stressed.losses} if stressed else {}))
    if (heatmap := diagnostics_heatmap(result)) is not None:
        ctx.tracker.log_bytes(run_id, heatmap, "diagnostics/heatmap.png")
    ctx.tracker.log_bytes(run_id, loss_curves(result, references.paired, f"trial {trial.number}:"), "loss_curves.png")
    memory = memory_table(result, references.paired)
    log_memory_breakdown(ctx.tracker, run_id, trial, result, references.paired)
    sig_metrics, sig_tags, sig_files, sig_plot = trial_signals(result.signals, references.paired.signals,
                                                               [r.signals for r in references.seeds])
    if sig_plot is not None:
        ctx.tracker.log_bytes(run_id, sig_plot, "signals/signals.png")
    ctx.tracker.finish_trial(
        run_id,
        metrics={"memory_saved": s.memory_saved, "memory_saved_probe": s.memory_saved_probe,
                 "memory_saved_target": s.memory_saved_target, "instability": s.instability, "loss_gap": s.loss_gap,
                 "tokens_per_s": s.tokens_per_s, "speedup": s.speedup, "spikes": s.spikes,
                 "peak_memory_mib": result.peak_memory_bytes / 2**20, "eval_loss": result.eval_loss,
                 "reference_eval_loss": references.paired.eval_loss, "wall_s": result.wall_s,
                 "steps_run": len(result.losses), "feasible": float(s.feasible), "diverged": float(s.diverged),
                 "reference_seeds": len(references.seeds), "fidelity_steps": rung, "start_step": result.start_step}
                | stability_metrics(s) | diagnostics_metrics(result) | sig_metrics
                | guided.predicted_metrics(ctx.sensitivity, trial.params),
        tags={"trial_state": "COMPLETE", "feasible": str(s.feasible).lower(), "diverged": str(s.diverged).lower(),
              "memory_source": result.memory_source, "divergence_reason": result.reason or "-",
              "duplicate_of": str(trial.user_attrs.get("duplicate_of", "-")), "stable": str(s.stable).lower(),
              "stable_under_stress": "-" if s.stable_under_stress is None else str(s.stable_under_stress).lower(),
              "stability_unit": objectives.stability_unit, "fidelity_steps": str(rung), "verdict": verdict(s),
              "promoted_from": str(trial.user_attrs.get(promotion.PROMOTED_FROM, "-"))} | diagnostics_tags(result)
             | sig_tags,
        artifacts={"policy.yaml": yaml.safe_dump(policy.to_dict(), sort_keys=False),
                   "policy.md": policy_table(policy, ctx.cfg.n_layers),
                   "probe_result.json": json.dumps(result.to_dict(), indent=1)}
                  | ({"memory.md": memory} if memory else {})
                  | ({"stress_probe_result.json": json.dumps(stressed.to_dict(), indent=1)} if stressed else {})
                  | diagnostics_artifacts(result) | sig_files,
    )
    retry_s = ctx.space.study.store_retry_s
    with_retry(lambda: ctx.study.tell(trial, objective_values(s, objectives)), "recording the trial", budget_s=retry_s)
    summary = with_retry(lambda: update_front(ctx), "updating the front", budget_s=retry_s)
    at = f" at {rung} steps" if ctx.space.study.fidelity else ""
    say(ctx, f"trial {trial.number}{at}: memory saved {100 * s.memory_saved:.2f}% ({result.memory_source}), "
              f"instability {100 * s.instability:.3f}% [{verdict(s)}]  {policy_summary(trial.params)}")
    if ctx.status is not None:
        line = ctx.status.trial_done(int(summary["trials_finished"]), int(summary["trials_feasible"]),
                                     int(summary["front_size"]))
        if not ctx.progress:  # no status bar to update: print the line
            say(ctx, line)
