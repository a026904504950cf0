"""Telling a trial: its score and Optuna values (on the worker's thread), then its MLflow record and the front.

The tell half of the loop in :mod:`precsearch.runtime._optimize` (as optuna keeps ``study/_tell.py``).
:func:`record` tells Optuna and hands the MLflow record to the worker's
:class:`~precsearch.runtime.recorder.Recorder`, which calls :func:`write_record` while the next
probe trains; a record that a crash interrupted is written again from the journal and the Optuna
trial (:func:`replay_pending`).
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import replace

import optuna
from filelock import FileLock
from optuna.trial import TrialState

from precsearch.config.space import ObjectivesSection
from precsearch.policy import Policy
from precsearch.probe.framework_step import FrameworkSpeed
from precsearch.probe.result import ProbeResult
from precsearch.runtime import recorder as journal
from precsearch.runtime.front_update import front_counts, update_front
from precsearch.runtime.liveness import WorkerId
from precsearch.runtime.recorder import RecordJob, Recorder
from precsearch.runtime.reference import References, uncached_steps
from precsearch.runtime.study_log import say
from precsearch.runtime.target_memory import TargetSaving, study_target_saving
from precsearch.runtime.target_speed import study_target_speed
from precsearch.runtime.session import StudyRun
from precsearch.search import guided, optuna_adapter, promotion
from precsearch.search.front import policy_summary
from precsearch.search.scored_trial import ScoredTrial, score_trial
from precsearch.search.scoring import speed_text
from precsearch.tracking.memory_report import breakdown, framework_breakdown, saving_sources
from precsearch.tracking.trial_record import SearchReading, log_trial
from precsearch.utils.retry import with_retry


def record(ctx: StudyRun, trial: optuna.Trial, run_id: str, policy: Policy, result: ProbeResult,
           references: References, stressed: ProbeResult | None, rung: int) -> None:
    """Score the trial (the one place it is scored), journal its record, tell Optuna, and hand the MLflow record
    to ``ctx.recorder``, which reads the stored score back."""
    space = ctx.space.model_dump(mode="json")
    framework = study_target_saving(space, policy)
    target_speed = study_target_speed(space, policy, result, references.paired)
    scored = _score(ctx.space.objectives, result, references, stressed, framework, target_speed)
    for key, value in (("score", scored.to_dict()), ("policy", policy.to_dict()), ("eval_loss", result.eval_loss),
                       ("peak_memory_bytes", result.peak_memory_bytes), ("memory_source", result.memory_source),
                       ("reason", result.reason), ("probe_result", result.to_dict())):
        trial.set_user_attr(key, value)
    if stressed:
        trial.set_user_attr("stress_result", stressed.to_dict())
    # kept for `precsearch front`, which reads Optuna only; the breakdown's files are the recorder's
    trial.set_user_attr("memory_sources", _memory_sources(result, references.paired, framework))
    trial.set_constraint("stability", scored.constraint)
    job = RecordJob(trial=trial.number, trial_id=optuna_adapter.trial_id(trial), run_id=run_id, rung=rung,
                    references={"seeds": [r.to_dict() for r in references.seeds],
                                "stress": references.stress.to_dict() if references.stress else None},
                    worker=ctx.worker.to_dict())
    # Journal first, Optuna second: a kill in between leaves the trial RUNNING in Optuna, which the
    # next run marks interrupted (its MLflow run KILLED, the entry dropped); after the tell, the
    # entry lets the next run write the MLflow record this run could not.
    journal.write_entry(ctx.workspace.output_dir, job)
    retry_s = ctx.space.study.store_retry_s
    with_retry(lambda: ctx.study.tell(trial, list(scored.values)), "recording the trial", budget_s=retry_s)
    summary = with_retry(lambda: front_counts(ctx.study, ctx.space.objectives), "reading the study",
                         budget_s=retry_s)
    job = replace(job, study_metrics=summary)  # in memory only: a replay need not re-log them
    at = f" at {rung} steps" if ctx.space.study.fidelity else ""
    source = result.memory_source if framework is None else f"in {framework.target}, predicted"
    speed = f", {speed_text(scored.score)}" if ctx.space.objectives.throughput else ""  # searched: shown
    say(ctx, f"trial {trial.number}{at}: memory saved {100 * scored.score.memory_saved:.2f}% "
              f"({source}){speed}, {scored.verdict}  {policy_summary(trial.params)}")
    if ctx.status is not None:
        # the references still to run, from the cache on disk: another worker may have run them
        ctx.status.eta.reference_steps = uncached_steps(ctx.space, ctx.references, ctx.device)
        line = ctx.status.trial_done(int(summary["trials_finished"]), int(summary["trials_feasible"]),
                                     int(summary["front_size"]), parallel=_workers_on(ctx))
        if not ctx.progress:  # no status bar to update: print the line
            say(ctx, line)
    recorder_of(ctx).submit(job)


def _workers_on(ctx: StudyRun) -> int:
    """This worker and the others on the study now, for the ETA (1 if the store cannot say): those running a
    trial, or that finished one within two of this worker's trial times (two workers finishing at the same
    moment each saw the other idle, and their ETAs doubled)."""
    window = datetime.timedelta(seconds=max(60.0, 2 * ctx.status.seconds_per_trial()))
    now = datetime.datetime.now()
    me = ctx.worker.to_dict()
    try:
        trials = ctx.study.get_trials(deepcopy=False)
    except Exception:  # a store hiccup costs the ETA its parallelism, not the trial
        return 1
    others = {str(t.user_attrs["worker"]) for t in trials
              if t.user_attrs.get("worker") not in (None, me)
              and (t.state is TrialState.RUNNING or (t.datetime_complete and now - t.datetime_complete < window))}
    return 1 + len(others)


def recorder_of(ctx: StudyRun) -> Recorder:
    """The worker's recorder, made on first use (inline with ``PRECSEARCH_SYNC_RECORD``)."""
    if ctx.recorder is None:
        retry_s = ctx.space.study.store_retry_s
        # after a Ctrl-C the front is left to the resumed run (seconds of plots)
        ctx.recorder = Recorder(lambda job: write_record(ctx, job),
                                lambda: ctx.stop.requested or with_retry(lambda: update_front(ctx, log_metrics=False),
                                                                         "updating the front", budget_s=retry_s),
                                ctx.workspace.output_dir, inline=journal.synchronous(),
                                abandon=lambda job, exc: ctx.tracker.fail_trial(
                                    job.run_id, f"its MLflow record could not be written ({type(exc).__name__}: "
                                    f"{exc}); the next run writes it again", retry=False))
    return ctx.recorder


def replay_pending(ctx: StudyRun) -> int:
    """Write the MLflow records that dead workers journalled but did not finish; returns how many.

    Entries of live workers are theirs; an entry whose trial Optuna does not hold COMPLETE (a kill
    before the tell) is dropped, the trial being failed and queued again by the usual recovery.
    """
    with FileLock(ctx.workspace.output_dir / "pending_records.lock"):  # two workers starting at once
        return _replay(ctx)


def _replay(ctx: StudyRun) -> int:
    done = 0
    for job in journal.pending(ctx.workspace.output_dir):
        worker = WorkerId.from_dict(job.worker)
        if worker is not None and worker != ctx.worker and not worker.is_dead():
            continue
        trial = optuna_adapter.stored_trial(ctx.study, job.trial_id)
        if trial.state is TrialState.COMPLETE and job.run_id not in ctx.lost_runs:
            if ctx.tracker.client.get_run(job.run_id).info.status != "FINISHED":
                write_record(ctx, job)
                done += 1
                say(ctx, f"trial {job.trial}: its MLflow record, cut short by an earlier run, written again")
        journal.drop_entry(ctx.workspace.output_dir, job.run_id)
    return done


def _score(objectives: ObjectivesSection, result: ProbeResult, references: References,
           stressed: ProbeResult | None, framework: TargetSaving | None, speed: FrameworkSpeed | None) -> ScoredTrial:
    return score_trial(result, references.paired, objectives, noise_floor=references.noise_floor_in(objectives),
                       stress=(stressed, references.stress) if stressed else None, standard=references.standard,
                       framework=(framework.target, framework.saved) if framework else None, framework_speed=speed)


def _memory_sources(result: ProbeResult, reference: ProbeResult, framework: TargetSaving | None) -> object:
    data = breakdown(result, reference)
    if framework is not None:  # the study scores its framework target's run: its parts, as its MLflow run shows
        data = framework_breakdown(data, dataclasses.asdict(framework))
    return saving_sources(data["target"]["trial"], data["target"]["baseline"])


def write_record(ctx: StudyRun, job: RecordJob) -> None:
    """A told trial's MLflow record, from the Optuna trial (its stored score: nothing is scored again) and
    ``job``; closes its run FINISHED."""
    trial = optuna_adapter.stored_trial(ctx.study, job.trial_id)
    run_id, rung, objectives = job.run_id, job.rung, ctx.space.objectives
    policy = Policy.from_dict(trial.user_attrs["policy"])
    result = ProbeResult.from_dict(trial.user_attrs["probe_result"])
    stressed = ProbeResult.from_dict(trial.user_attrs["stress_result"]) if "stress_result" in trial.user_attrs \
        else None
    stress = job.references.get("stress")
    references = References(seeds=[ProbeResult.from_dict(r) for r in job.references["seeds"]],
                            stress=ProbeResult.from_dict(stress) if stress else None)
    scored = ScoredTrial.from_stored(trial.user_attrs["score"], objectives)
    if job.study_metrics:  # the study's progress, one step per trial (the front files follow per burst)
        ctx.tracker.log_study(job.study_metrics)
    reading = SearchReading(scored.score, scored.verdict, dict(scored.stability),
                            guided.predicted_metrics(ctx.sensitivity, trial.params), objectives.instability_unit, rung,
                            str(trial.user_attrs.get(promotion.PROMOTED_FROM, "-")), scored.instability)
    framework = study_target_saving(ctx.space.model_dump(mode="json"), policy)
    log_trial(ctx.tracker, run_id, trial, policy, ctx.space.model.probe().n_layers, result, stressed, references.paired,
              references.seeds, reading, after_steps=lambda: journal.fault("after_steps"),
              framework_memory=dataclasses.asdict(framework) if framework is not None else None)
