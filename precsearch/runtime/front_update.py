"""After told trials: the Pareto front tagged in MLflow (with the targets that run each trial as it is,
``runs_as_is_in``), written to ``front/``, the study's metrics.

:func:`update_front` runs on the recorder thread once its queue is empty (and at study end);
:func:`front_counts` gives the terminal's counts at once, from Optuna alone.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from precsearch.config.space import ObjectivesSection
from precsearch.runtime.session import StudyRun
from precsearch.runtime.study_store import run_ids as _run_ids
from precsearch.runtime.target_space import runs_as_is_of_study
from precsearch.search.front import trial_rows
from precsearch.search.scoring import objective_names
from precsearch.search.summary import finished_count, study_metrics
from precsearch.tracking.front_report import beside_standard, write_front


def update_front(ctx: StudyRun, log_metrics: bool = True) -> dict[str, float]:
    """Tag the front, write and log its files, the study's metrics (unless not ``log_metrics``: the
    recorder logs each trial's) and views; returns the metrics."""
    names = objective_names(ctx.space.objectives)
    rows = runs_as_is_of_study(ctx.study, trial_rows(ctx.study, names))
    front = {r["trial"] for r in rows if r["pareto"]}
    # every scored trial, also those a longer rung of the same policy superseded (no longer in rows)
    complete = ctx.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    scored = {t.number for t in complete if "score" in t.user_attrs}
    # every worker tags every run, also those other workers started since this one opened the study:
    # otherwise a trial that left the front keeps pareto=true if its worker is not the last to update
    run_ids = {n: r for n, r in _run_ids(ctx.study).items() if r not in ctx.lost_runs}
    targets = {r["trial"]: {k: f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]
                            for k in ("runs_as_is_in", "target_memory_saved") if r.get(k) not in (None, "")}
               for r in rows}
    ctx.tracker.set_pareto({n: run_ids[n] for n in sorted(scored) if n in run_ids}, front, targets)
    files = write_front(rows, ctx.workspace.output_dir / "front", ctx.space.objectives.instability_limit,
                        ctx.space.objectives.instability_unit, ctx.space.objectives.throughput)
    ctx.tracker.log_front(files)
    metrics = study_metrics(rows, finished_count(ctx.study), names)
    if log_metrics:
        ctx.tracker.log_study(metrics)
    ctx.tracker.set_view(sorted({name for r in rows for name in r["params"]}), ctx.space.objectives.instability_unit,
                         noise=ctx.space.objectives.reference_seeds >= 2, standard=beside_standard(rows))
    return metrics


def front_counts(study: optuna.Study, objectives: ObjectivesSection) -> dict[str, float]:
    """The study's metrics (trials finished, feasible, front size...) from Optuna, writing nothing."""
    names = objective_names(objectives)
    return study_metrics(trial_rows(study, names), finished_count(study), names)
