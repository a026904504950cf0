"""Telling a trial: its score, MLflow run (metrics, tags, artifacts) and Optuna values, then the front.

The tell half of the loop in :mod:`precsearch.runtime._optimize` (as optuna keeps ``study/_tell.py``).
"""

from __future__ import annotations

import optuna

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
    instability_text,
    objective_values,
    score,
    stability_metrics,
    verdict,
)
from precsearch.tracking.trial_record import SearchReading, log_trial
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
    predicted = guided.predicted_metrics(ctx.sensitivity, trial.params)
    reading = SearchReading(s, verdict(s), stability_metrics(s), predicted, objectives.instability_unit, rung,
                            str(trial.user_attrs.get(promotion.PROMOTED_FROM, "-")))
    log_trial(ctx.tracker, run_id, trial, policy, ctx.cfg.n_layers, result, stressed, references.paired,
              references.seeds, reading)
    retry_s = ctx.space.study.store_retry_s
    with_retry(lambda: ctx.study.tell(trial, objective_values(s, objectives)), "recording the trial", budget_s=retry_s)
    summary = with_retry(lambda: update_front(ctx), "updating the front", budget_s=retry_s)
    at = f" at {rung} steps" if ctx.space.study.fidelity else ""
    say(ctx, f"trial {trial.number}{at}: memory saved {100 * s.memory_saved:.2f}% ({result.memory_source}), "
              f"instability {instability_text(s)} [{verdict(s)}]  {policy_summary(trial.params)}")
    if ctx.status is not None:
        line = ctx.status.trial_done(int(summary["trials_finished"]), int(summary["trials_feasible"]),
                                     int(summary["front_size"]))
        if not ctx.progress:  # no status bar to update: print the line
            say(ctx, line)
