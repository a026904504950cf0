"""The Optuna driver: ask a policy, run its probe, score it, tell Optuna, log to MLflow.

It uses Optuna's ask-and-tell interface so that each trial is one plain loop
iteration: the probe, the scoring, the MLflow run and the Pareto update stay
readable in one place. The same loop (:func:`work`) runs in ``precsearch run``
(one worker, in-process), in each process of ``precsearch run --workers N`` /
``--gpus``, and in ``precsearch worker`` on other machines; several loops
share one study through its storage.

With ``study.fidelity``, the best policies of each rung are promoted to the
next, longer rung once it settles (:mod:`precsearch.search.promotion`); the
same loop runs those promoted trials after the study's ``n_trials``.

Nothing finished is lost: a study is resumable (the same command continues
it), a probe runs in a child process (:mod:`precsearch.search.executor`) so
its crash is a failed trial, and trials whose worker died are failed and
queued again (:mod:`precsearch.search.liveness`).
"""

from __future__ import annotations

import fcntl
import json
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import torch
import yaml
from filelock import FileLock
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import TrialState
from tqdm import tqdm

from precsearch.search import progress as terminal

from precsearch.backends import BackendUnavailable, resolve_device
from precsearch.config.space import ProbeSection, Space
from precsearch.errors import UserError
from precsearch.policy import MemoryKnobs, Policy
from precsearch.probe.data import load_batches  # noqa: F401 - re-exported for scripts
from precsearch.probe.continuation import Leg
from precsearch.probe.model import ModelConfig
from precsearch.probe.result import ProbeResult
from precsearch.search import promotion, stores
from precsearch.search.duplicates import MAX_DUPLICATES_IN_A_ROW, await_twin, is_duplicate, tell_duplicate
from precsearch.search.executor import ProbeExecutor
from precsearch.search.front import format_table, policy_summary, trial_rows
from precsearch.search.identity import check_directory
from precsearch.search.liveness import WorkerId, trial_worker
from precsearch.search.lost_stores import lost_runs
from precsearch.search.reference import ReferenceCache, References, gather_references, stress_probe
from precsearch.search.retry import with_retry
from precsearch.search.rungs import drop_spent, rung_probe, trial_leg, trial_rung, unneeded
from precsearch.search.sampling import suggest_policy
from precsearch.search.scoring import (constraint_value, objective_names, objective_values, score,
                                       stability_metrics, verdict)
from precsearch.search.stopping import StopRequest, deferred_signals
from precsearch.search.study_store import open_study as _open_study
from precsearch.search.study_store import run_ids as _run_ids
from precsearch.search.summary import study_metrics
from precsearch.search.workspace import Workspace
from precsearch.tracking import Tracker
from precsearch.tracking.diagnostics_report import (diagnostics_artifacts, diagnostics_heatmap, diagnostics_metrics,
                                                     diagnostics_tags)
from precsearch.tracking.front_report import write_front
from precsearch.tracking.signals_report import trial_signals
from precsearch.tracking.memory_report import log_memory_breakdown
from precsearch.tracking.trial_report import loss_curves, memory_table, policy_table


@dataclass
class StudyRun:
    """Everything a worker's trials need, built once per process."""

    space: Space
    workspace: Workspace
    study: optuna.Study
    tracker: Tracker
    executor: ProbeExecutor | None
    device: torch.device
    cfg: ModelConfig
    references: ReferenceCache
    worker: WorkerId
    stop: StopRequest
    name: str = ""
    progress: bool = True
    run_ids: dict[int, str] = field(default_factory=dict)
    status: terminal.StudyStatus | None = None
    lost_runs: set[str] = field(default_factory=set)  # run ids the study records but the MLflow store lacks


def run_study(space: Space, space_text: str, output_dir: Path | None = None, *, n_trials: int | None = None,
              progress: bool = True, workers: int = 1, gpus: list[int] | None = None) -> list[dict]:
    """Run (or resume) the study a space file describes; return the final trial rows.

    With ``workers`` > 1 or ``gpus``, trials run in that many worker processes (one per GPU slice).
    """
    ws = Workspace.for_space(space, output_dir)
    ws.prepare()
    check_directory(ws)  # before anything is written: a refused run leaves the directory as it was
    ws.follow_move()
    target = n_trials or space.study.n_trials
    if workers > 1 or gpus:
        from precsearch.search.launcher import run_parallel

        return run_parallel(space, space_text, ws, target, workers=workers, gpus=gpus, progress=progress)
    with open_run(space, ws, progress, space_text=space_text) as ctx:
        recover_dead_trials(ctx)
        _say(ctx, f"study '{space.study.name}': {finished_count(ctx.study)} of {target} trials already "
                  f"finished; output in {ws.output_dir}")
        try:
            work(ctx, target)
        except KeyboardInterrupt:
            ctx.tracker.close("KILLED")
            raise
        _update_front(ctx)  # also after a resume with nothing left to run: a kill may have come before the update
        if ctx.stop.requested:
            ctx.tracker.close("KILLED")
            raise KeyboardInterrupt
        ctx.tracker.close("FINISHED")
        return trial_rows(ctx.study, objective_names(space.objectives))


@contextmanager
def open_run(space: Space, ws: Workspace, progress: bool, *, space_text: str | None = None,
             parent_id: str | None = None, probes: bool = True, name: str = "", sampler_offset: int = 0):
    """Open the study's storage, MLflow tracker and (with ``probes``) a probe process; close them after.

    The probe process starts first: it imports torch and the backend (Transformer Engine: about 12 s)
    while the stores open, rather than when the first probe is asked for.
    """
    stop = StopRequest()
    executor = ProbeExecutor(space, space.study.trial_timeout_s, lambda: stop.requested) if probes else None
    if executor is not None:
        executor.start()
    try:
        yield from _open_with(space, ws, progress, executor, stop, space_text=space_text, parent_id=parent_id,
                              name=name, sampler_offset=sampler_offset)
    finally:
        if executor is not None:
            executor.close()


def _open_with(space: Space, ws: Workspace, progress: bool, executor: ProbeExecutor | None, stop: StopRequest, *,
               space_text: str | None, parent_id: str | None, name: str, sampler_offset: int):
    with FileLock(ws.output_dir / "stores.lock"):  # two runs started at once: one creates the stores' tables
        storage = stores.open_storage(ws.storage_url, space.study)
        tracker = stores.open_tracker(ws, parent_id, retry_s=space.study.store_retry_s)
        study = _open_study(space, ws, storage, tracker, sampler_offset)
    try:
        device = resolve_device(space.probe.device)
    except BackendUnavailable as exc:
        raise UserError(str(exc), field="probe.device") from None
    ctx = StudyRun(space=space, workspace=ws, study=study, tracker=tracker, executor=executor, device=device,
                   cfg=space.model.probe(), references=ReferenceCache(ws.references_dir),
                   worker=WorkerId.current(), stop=stop, name=name, progress=progress)
    ctx.stop._say = lambda message: _say(ctx, message)
    stale = getattr(storage, "get_heartbeat_stale_trial_callback", lambda: None)()
    if stale is not None:
        stale.tracker, stale.say = tracker, (lambda message: _say(ctx, message))
    if space_text is not None:  # the run command's driver: the directory is this study's from now on
        ws.save()
        tracker.log_space(space_text, {"study": space.study.name, "backend": space.backend.value,
                                       "device": str(device), "probe_layers": ctx.cfg.n_layers,
                                       "probe_steps": space.probe.steps})
    ctx.run_ids = _run_ids(study)
    ctx.lost_runs = lost_runs(tracker, ctx.run_ids, lambda message: _say(ctx, message))
    ctx.run_ids = {n: r for n, r in ctx.run_ids.items() if r not in ctx.lost_runs}
    with ctx.stop:
        yield ctx


def finished_count(study: optuna.Study) -> int:
    """Trials that count towards ``n_trials``: complete, or failed by their own probe.

    Trials failed because their run was interrupted or their worker died are not counted: their
    params are queued again. Promoted evaluations (longer rungs of the same policies) and duplicates
    (:mod:`precsearch.search.duplicates`) are not counted.
    """
    return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
               if (t.state is TrialState.COMPLETE or "fail_reason" in t.user_attrs) and not promotion.is_promoted(t)
               and not is_duplicate(t))


def recover_dead_trials(ctx: StudyRun) -> None:
    """RUNNING trials whose worker process on this host is gone: fail, close their MLflow run, queue again.

    Trials of live workers, or of workers on other hosts, are left to the heartbeats.
    """
    for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial_worker(t)
        if worker is not None and not worker.is_dead():
            continue
        ctx.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        ctx.study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        if t.user_attrs.get("mlflow_run_id") and t.user_attrs["mlflow_run_id"] not in ctx.lost_runs:
            ctx.tracker.fail_trial(t.user_attrs["mlflow_run_id"], "interrupted (the run was stopped)", "KILLED")
        _requeue(ctx.study, t)
        _say(ctx, f"trial {t.number} was interrupted by an earlier run: marked failed, its params queued again")

    def dead(tag: str) -> bool:
        host, _, pid = tag.partition(":")
        return bool(pid.isdigit()) and WorkerId(host, int(pid), 0).is_dead()

    ctx.tracker.close_orphans(dead)


def work(ctx: StudyRun, target: int) -> None:
    """Run trials until the study has ``target`` finished ones (or a stop is asked for), then its promotions.

    While the trials still needed are all running elsewhere, wait: one of them may go stale
    (its worker died) and need running again. The same holds for a rung still being decided.
    """
    ctx.status = terminal.StudyStatus(ctx.space.study.name, target, finished_count(ctx.study), ctx.progress)
    try:
        _work(ctx, target)
    finally:
        ctx.status.close()


def _work(ctx: StudyRun, target: int) -> None:
    in_a_row = 0
    while not ctx.stop.requested:
        _fail_stale(ctx)
        finished = with_retry(lambda: finished_count(ctx.study), "reading the study",
                              budget_s=ctx.space.study.store_retry_s)
        if finished >= target:
            # a run asked for fewer trials than the study's (--n-trials) has not settled the first rung
            action = _promotions(ctx) if target >= ctx.space.study.n_trials else "done"
            if action == "done":
                return
            if action == "run":
                _run_trial(ctx, promoted_only=True)
            else:
                time.sleep(min(2.0, ctx.space.study.heartbeat_s))
            continue
        if finished + _running(ctx) >= target:
            time.sleep(min(2.0, ctx.space.study.heartbeat_s))
            continue
        in_a_row = 0 if _run_trial(ctx, target=target) else in_a_row + 1
        if in_a_row >= MAX_DUPLICATES_IN_A_ROW:
            _say(ctx, f"the sampler proposed {in_a_row} policies in a row that were already scored: the space "
                      f"looks exhausted; stopping with {finished} distinct policies")
            return


def _promotions(ctx: StudyRun) -> str:
    """Queue the promotions of every settled rung; ``run``, ``wait`` or ``done`` (see promotion.plan)."""
    fidelity = ctx.space.study.fidelity
    if fidelity is None:
        return "done"
    with _ask_lock(ctx):  # one worker of this directory decides at a time; other machines: superseded_copy
        plan = promotion.plan(ctx.study.get_trials(deepcopy=False), fidelity, objective_names(ctx.space.objectives))
        promotion.enqueue(ctx.study, plan.promote)
        drop_spent(ctx.workspace.output_dir, ctx.study, ctx.space, objective_names(ctx.space.objectives))
    for trial, rung in plan.promote:
        _say(ctx, f"trial {trial.number} promoted to {rung} steps  {policy_summary(trial.params)}")
    return plan.action


def _fail_stale(ctx: StudyRun) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        with_retry(lambda: optuna.storages.fail_stale_trials(ctx.study), "checking heartbeats",
                   budget_s=ctx.space.study.store_retry_s)


def _running(ctx: StudyRun) -> int:
    return sum(1 for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
               if not promotion.is_promoted(t))


def _run_trial(ctx: StudyRun, promoted_only: bool = False, target: int | None = None) -> bool:
    """Ask for a trial and run it; False when it was a duplicate (told at once, nothing run).

    With ``target``, nothing is asked if the study's finished and running trials reach it once this
    worker holds the ask lock (another local worker may have asked since the count outside it).
    """
    retry_s = ctx.space.study.store_retry_s
    with _ask_lock(ctx):
        if target is not None and finished_count(ctx.study) + _running(ctx) >= target:
            return True
        trial = with_retry(ctx.study.ask, "asking Optuna for a trial", budget_s=retry_s)
    if _not_needed(ctx, trial, promoted_only):
        return True
    trial.set_user_attr("worker", ctx.worker.to_dict())
    if ctx.status is not None:
        ctx.status.trial_started(trial.number)
    rung, source = trial_rung(ctx.study, ctx.space, trial)
    policy = suggest_policy(ctx.space, trial)
    if promotion.is_promoted(trial):
        twin = None
    else:  # another worker may be running the same policy: its result is this one's
        with get_heartbeat_thread(trial._trial_id, ctx.study._storage):
            twin = await_twin(ctx.study, trial, rung, min(2.0, ctx.space.study.heartbeat_s),
                              lambda: ctx.stop.requested)
    if twin is not None:  # probes are seeded: the same params would give the same result again
        tell_duplicate(ctx.study, trial, twin, retry_s)
        return False
    run_id = ctx.tracker.start_trial(trial.number, trial.params, worker=str(ctx.worker))
    trial.set_user_attr("mlflow_run_id", run_id)
    ctx.run_ids[trial.number] = run_id
    with get_heartbeat_thread(trial._trial_id, ctx.study._storage):
        try:
            reference = _reference(ctx, policy, rung)
            leg = trial_leg(ctx.space, ctx.workspace.output_dir, trial.number, rung, source)
            if source is not None and leg.resume_from is None:
                _say(ctx, f"trial {trial.number}: no checkpoint of trial {source.number} here; "
                          f"running its {rung} steps from step 0")
            result = _probe(ctx, policy, f"trial {trial.number}", rung_probe(ctx.space, rung),
                            trial=trial.number, leg=leg)
            stressed = _stressed_result(ctx, trial, policy, source)
        except (UserError, KeyboardInterrupt):
            _abandon(ctx, trial, run_id, "interrupted (the run was stopped)")
            raise
        except Exception as exc:  # a probe that crashes is a failed trial, not a failed study
            reason = f"{type(exc).__name__}: {exc}" if not str(exc).startswith("probe process") else str(exc)
            trial.set_user_attr("fail_reason", reason)
            ctx.tracker.fail_trial(run_id, reason)
            with_retry(lambda: ctx.study.tell(trial, state=TrialState.FAIL), "recording the trial", budget_s=retry_s)
            _say(ctx, f"trial {trial.number} failed: {reason}")
            return True
        try:
            _record(ctx, trial, run_id, policy, result, reference, stressed, rung)
        except KeyboardInterrupt:  # a second Ctrl-C while recording: close the trial unless Optuna has it
            if ctx.study._storage.get_trial(trial._trial_id).state is TrialState.RUNNING:
                _abandon(ctx, trial, run_id, "interrupted (the run was stopped)")
            raise
    return True


def _not_needed(ctx: StudyRun, trial: optuna.Trial, promoted_only: bool) -> bool:
    """Close (FAIL, uncounted, unlogged) a trial :func:`~precsearch.search.rungs.unneeded` says not to run."""
    reason = unneeded(ctx.study, ctx.space, trial.number, promoted_only)
    if reason is None:
        return False
    trial.set_user_attr("not_needed", reason)
    with_retry(lambda: ctx.study.tell(trial, state=TrialState.FAIL), "recording the trial",
               budget_s=ctx.space.study.store_retry_s)
    return True


@contextmanager
def _ask_lock(ctx: StudyRun):
    """One ``ask`` at a time among the workers sharing this output directory.

    Taking a queued (WAITING) trial relies on ``SELECT ... FOR UPDATE``, which sqlite ignores: two
    local workers asking at once could both take the same queued trial and run it twice (seen in
    the resume test). PostgreSQL locks the row itself; the file lock costs nothing there.
    """
    ctx.workspace.output_dir.mkdir(parents=True, exist_ok=True)
    with open(ctx.workspace.output_dir / "ask.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _requeue(study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial) -> None:
    """Queue ``trial``'s params (and rung, for a promoted trial) to run again, once.

    Optuna's skip_if_exists would also skip it for the failed trial itself.
    """
    keep = (promotion.FIDELITY, promotion.PROMOTED_FROM)
    attrs = {k: v for k, v in trial.user_attrs.items() if k in keep}
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    # a queued trial has no params yet: compare the params it is queued with
    if not any(t.system_attrs.get("fixed_params") == trial.params
               and {k: v for k, v in t.user_attrs.items() if k in keep} == attrs for t in waiting):
        study.enqueue_trial(trial.params, user_attrs=attrs or None)


def _abandon(ctx: StudyRun, trial: optuna.Trial, run_id: str, reason: str) -> None:
    """Close a trial the worker is stopping in (Ctrl-C, SIGTERM, a store gone): FAIL, queued again.

    The MLflow run gets one attempt only: a worker told to stop must not wait out the retry budget.
    If it fails, the next ``precsearch run`` closes the run (its worker is gone by then).
    """
    with deferred_signals():
        trial.set_user_attr("interrupted", True)
        ctx.study.tell(trial, state=TrialState.FAIL)
        _requeue(ctx.study, trial)
    try:
        ctx.tracker.fail_trial(run_id, reason, "KILLED", retry=False)
    except Exception as exc:  # noqa: BLE001 - best effort, see above
        _say(ctx, f"trial {trial.number}: could not close its MLflow run now ({type(exc).__name__}); "
                  "the next run will")


def _reference(ctx: StudyRun, policy: Policy, rung: int) -> References:
    """The BF16 references (every seed at ``rung`` steps, and the stress lr) for ``policy``'s gradient clipping."""
    baseline = ctx.space.baseline_knobs()
    reference = Policy.bf16(policy.clip_grad, baseline)
    told = []

    def run(probe: ProbeSection, label: str, leg: Leg | None) -> ProbeResult:
        if not told:  # only when one is not cached: say why BF16 probes run between trials
            told.append(True)
            _say(ctx, terminal.reference_notice(policy.clip_grad, ctx.space.objectives.reference_seeds, rung,
                                                stress_probe(ctx.space) is not None))
        return _probe(ctx, reference, label, probe, leg=leg)

    return gather_references(ctx.space, ctx.references, ctx.device, policy.clip_grad, run, steps=rung)


def _stressed_result(ctx: StudyRun, trial: optuna.Trial, policy: Policy,
                     source: optuna.trial.FrozenTrial | None = None) -> ProbeResult | None:
    """The policy's probe at the stress lr, or None without ``objectives.stress``; a promoted trial reuses the
    one of the trial it continues (the stress probe is not cut into rungs)."""
    probe = stress_probe(ctx.space)
    if probe is None:
        return None
    if source is not None and "stress_result" in source.user_attrs:
        return ProbeResult.from_dict(source.user_attrs["stress_result"])
    return _probe(ctx, policy, f"trial {trial.number} (stress)", probe)


def _probe(ctx: StudyRun, policy: Policy, label: str, probe: ProbeSection | None = None,
           trial: int | None = None, leg: Leg | None = None) -> ProbeResult:
    """Run one probe of ``policy`` in the probe process; ``probe`` overrides the space's probe section
    (another seed, a stress lr, a rung's steps), ``leg`` continues a run. Raises ProbeFailed / ProbeCrashed
    when it produced no result."""
    probe = probe or ctx.space.probe
    steps = terminal.probe_bar(probe.steps, label, ctx.progress)

    def on_step(step: int, loss: float, grad_norm: float) -> None:
        steps.update(1)
        steps.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if ctx.status is not None:
            ctx.status.tick()

    try:
        return ctx.executor.run(probe, policy, label, on_step, trial=trial, leg=leg)
    finally:
        steps.close()


def _record(ctx: StudyRun, trial: optuna.Trial, run_id: str, policy: Policy, result: ProbeResult,
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
                | stability_metrics(s) | diagnostics_metrics(result) | sig_metrics,
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
    summary = with_retry(lambda: _update_front(ctx), "updating the front", budget_s=retry_s)
    at = f" at {rung} steps" if ctx.space.study.fidelity else ""
    _say(ctx, f"trial {trial.number}{at}: memory saved {100 * s.memory_saved:.2f}% ({result.memory_source}), "
              f"instability {100 * s.instability:.3f}% [{verdict(s)}]  {policy_summary(trial.params)}")
    if ctx.status is not None:
        line = ctx.status.trial_done(int(summary["trials_finished"]), int(summary["trials_feasible"]),
                                     int(summary["front_size"]))
        if not ctx.progress:  # no status bar to update: print the line
            _say(ctx, line)


def _update_front(ctx: StudyRun) -> dict[str, float]:
    """Tag the front, write and log its files, the study's metrics and views; returns the metrics."""
    names = objective_names(ctx.space.objectives)
    rows = trial_rows(ctx.study, names)
    front = {r["trial"] for r in rows if r["pareto"]}
    # every scored trial, also those a longer rung of the same policy superseded (no longer in rows)
    complete = ctx.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    scored = {t.number for t in complete if "score" in t.user_attrs}
    # every worker tags every run, also those other workers started since this one opened the study:
    # otherwise a trial that left the front keeps pareto=true if its worker is not the last to update
    ctx.run_ids |= {n: r for n, r in _run_ids(ctx.study).items() if r not in ctx.lost_runs}
    ctx.tracker.set_pareto({n: ctx.run_ids[n] for n in sorted(scored) if n in ctx.run_ids}, front)
    files = write_front(rows, ctx.workspace.output_dir / "front", ctx.space.objectives.stability_limit,
                        ctx.space.objectives.stability_unit)
    ctx.tracker.log_front(files)
    metrics = study_metrics(rows, finished_count(ctx.study), names)
    ctx.tracker.log_study(metrics)
    ctx.tracker.set_view(sorted({name for r in rows for name in r["params"]}))
    return metrics


def _say(ctx: StudyRun, message: str) -> None:
    if ctx.name:
        message = f"[{ctx.name}] {message}"
    if ctx.progress:
        tqdm.write(message)
    else:
        print(message, flush=True)


__all__ = ["run_study", "format_table"]
