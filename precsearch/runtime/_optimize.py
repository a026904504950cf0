"""The loop of a study (:func:`work`): ask Optuna for a trial, run its probes, hand it to the tell.

Each trial is one iteration of Optuna's ask-and-tell interface: the ask (under a file lock shared
by the workers of one output directory), the check for a twin another worker already runs, the
BF16 references, the probe (and the stress probe), then :func:`precsearch.runtime._tell.record`.
The same loop runs in every worker of a study (see :mod:`precsearch.runtime.study`). A trial the
worker is stopped in, or whose worker died, is failed and its params queued again
(:func:`recover_dead_trials`).
"""

from __future__ import annotations

import datetime
import time
import warnings
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import optuna
from filelock import FileLock
from optuna.trial import TrialState

from precsearch.config.space import ProbeSection
from precsearch.errors import UserError
from precsearch.policy import Policy
from precsearch.probe.continuation import Leg
from precsearch.probe.result import ProbeResult
from precsearch.redact import first_line
from precsearch.runtime import progress as terminal
from precsearch.runtime._tell import record, replay_pending
from precsearch.runtime.executor import ProbeInterrupted
from precsearch.runtime.liveness import Heartbeat, WorkerId, trial_worker
from precsearch.runtime.reference import References, gather_references, stress_probe, uncached_steps
from precsearch.runtime.study_log import say
from precsearch.runtime.recorder import STOP_WAIT_S
from precsearch.runtime.session import StudyRun
from precsearch.runtime.stopping import StopRequest, deferred_signals
from precsearch.search import optuna_adapter, promotion, proposals
from precsearch.search.duplicate_trials import (
    MAX_DUPLICATES_IN_A_ROW,
    await_twin,
    tell_duplicate,
)
from precsearch.search.front import policy_summary
from precsearch.search.rungs import (
    drop_spent,
    rung_probe,
    trial_leg,
    trial_rung,
    unneeded,
)
from precsearch.search.sampling import suggest_policy
from precsearch.search.scoring import objective_names
from precsearch.search.summary import finished_count, finished_in
from precsearch.utils import trace
from precsearch.utils.processes import wait_unless
from precsearch.utils.retry import with_retry


#: A RUNNING trial without a worker younger than this was just asked by another process starting beside this
#: one (ask, then its worker attribute): two runs started at once on one directory failed each other's trial.
_JUST_ASKED = datetime.timedelta(seconds=60)


def recover_dead_trials(ctx: StudyRun) -> None:
    """RUNNING trials whose worker process on this host is gone: fail, close their MLflow run, queue again.

    Trials of live workers, or of workers on other hosts, are left to the heartbeats. First, the MLflow
    records that a dead worker journalled but did not finish are written (before their runs would be
    closed as orphans).
    """
    replay_pending(ctx)
    _fail_dead_running(ctx)

    def dead(tag: str) -> bool:
        host, _, pid = tag.partition(":")
        return bool(pid.isdigit()) and WorkerId(host, int(pid), 0).is_dead()

    ctx.tracker.close_orphans(dead)


def _fail_dead_running(ctx: StudyRun) -> None:
    """Fail and queue again the RUNNING trials whose local worker is gone, or that have had no worker too long.

    Also called while this worker waits on running trials: a process killed between its ask and writing its
    worker leaves a trial no heartbeat covers, which would otherwise be waited on for ever.
    """
    now = datetime.datetime.now()
    for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial_worker(t)
        if worker is not None and not worker.is_dead():
            continue
        if worker is None and t.datetime_start is not None and now - t.datetime_start < _JUST_ASKED:
            continue  # asked by a live process a moment ago, its worker not written yet: the heartbeats judge it
        optuna_adapter.fail_as_interrupted(ctx.study, t)
        if t.user_attrs.get("mlflow_run_id") and t.user_attrs["mlflow_run_id"] not in ctx.lost_runs:
            ctx.tracker.fail_trial(t.user_attrs["mlflow_run_id"], "interrupted (the run was stopped)", "KILLED")
        _requeue(ctx.study, t)
        say(ctx, f"trial {t.number} was interrupted by an earlier run: marked failed, its params queued again")


def work(ctx: StudyRun, target: int) -> None:
    """Run trials until the study has ``target`` finished ones (or a stop is asked for), then its promotions.

    While the trials still needed are all running elsewhere, wait: one of them may go stale
    (its worker died) and need running again. The same holds for a rung still being decided.
    """
    ctx.status = terminal.StudyStatus(ctx.space.study.name, target, finished_count(ctx.study), ctx.progress,
                                      _eta(ctx))
    try:
        _work(ctx, target)
        if ctx.executor is not None:  # no probe is left: its process frees its memory while the records are written
            ctx.executor.release()
    except KeyboardInterrupt as exc:
        if ctx.recorder is not None and not isinstance(exc, ProbeInterrupted):
            # a second Ctrl-C or SIGTERM: stop at once; the journal keeps what is not recorded yet
            # (waiting could also wait on a store write the interrupt cut short, holding its lock)
            ctx.recorder.abandon()
            ctx.recorder = None
        raise
    finally:
        try:
            if ctx.recorder is not None:  # the told trials' records first (after a Ctrl-C, for STOP_WAIT_S)
                with trace.span("recorder drain"):
                    if not ctx.recorder.close(wait_s=STOP_WAIT_S if ctx.stop.requested else None,
                                              stopping=lambda: ctx.stop.requested):
                        say(ctx, "the MLflow records not written yet are written when the study resumes")
        finally:
            ctx.recorder = None
            ctx.status.close()


def _eta(ctx: StudyRun) -> terminal.Eta:
    """The estimator of the time left: a trial's probe steps, the BF16 reference steps not cached yet, and the
    steps of the reading's BF16 sides still to make in this worker's probe process (none for most readings)."""
    stressed = stress_probe(ctx.space)
    trial_steps = ctx.space.probe.steps + (stressed.steps if stressed is not None else 0)
    return terminal.Eta(trial_steps, uncached_steps(ctx.space, ctx.references, ctx.device),
                        bf16_side_steps=ctx.sides.steps_ahead())


def _work(ctx: StudyRun, target: int) -> None:
    in_a_row = 0
    while not ctx.stop.requested:
        with trace.span("heartbeats + count"):
            _fail_stale(ctx.study, ctx.space.study.store_retry_s)
            finished, running = with_retry(lambda: _finished_and_running(ctx.study), "reading the study",
                                           budget_s=ctx.space.study.store_retry_s)
        if finished >= target:
            # a run asked for fewer trials than the study's (--n-trials) has not settled the first rung
            action = _promotions(ctx) if target >= ctx.space.study.n_trials else "done"
            if action == "done":
                return
            if action == "run":
                _run_trial(ctx, promoted_only=True)
            else:
                _pause(ctx.stop, min(2.0, ctx.space.study.heartbeat_s))
            continue
        if finished + running >= target:
            _fail_dead_running(ctx)
            _pause(ctx.stop, min(2.0, ctx.space.study.heartbeat_s))
            continue
        ran = _run_trial(ctx, target=target)
        if ran is None:  # the next batch of proposals needs the results of trials still running
            _fail_dead_running(ctx)
            _pause(ctx.stop, min(0.5, ctx.space.study.heartbeat_s))
            continue
        in_a_row = 0 if ran else in_a_row + 1
        if in_a_row >= MAX_DUPLICATES_IN_A_ROW:
            say(ctx, f"the sampler proposed {in_a_row} policies in a row that were already scored: the space "
                      f"looks exhausted; stopping with {finished} distinct policies")
            return


def _pause(stop: StopRequest, seconds: float) -> None:
    """Wait ``seconds`` for trials running elsewhere, ending early on a stop request."""
    wait_unless(lambda: stop.requested, seconds)


def _promotions(ctx: StudyRun) -> str:
    """Queue the promotions of every settled rung; ``run``, ``wait`` or ``done`` (see promotion.plan)."""
    fidelity = ctx.space.study.fidelity
    if fidelity is None:
        return "done"
    # one worker of this directory decides at a time; other machines: superseded_copy
    with _ask_lock(ctx.workspace.output_dir):
        plan = promotion.plan(ctx.study.get_trials(deepcopy=False), fidelity, objective_names(ctx.space.objectives))
        promotion.enqueue(ctx.study, plan.promote)
        drop_spent(ctx.workspace.output_dir, ctx.study, ctx.space, objective_names(ctx.space.objectives))
    for trial, rung in plan.promote:
        say(ctx, f"trial {trial.number} promoted to {rung} steps  {policy_summary(trial.params)}")
    return plan.action


def _fail_stale(study: optuna.Study, retry_s: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        with_retry(lambda: optuna.storages.fail_stale_trials(study), "checking heartbeats", budget_s=retry_s)


def _finished_and_running(study: optuna.Study, below: int | None = None) -> tuple[int, int]:
    """Finished trials and the running ones (numbered below ``below``, if given), from one read of the study.

    Read apart, a trial that finished between the two reads was counted twice (running, then finished) or not
    at all: local workers asked one trial too many, then closed it as surplus (CI, three workers, 2026-12-05).
    """
    trials = study.get_trials(deepcopy=False)
    running = sum(1 for t in trials if t.state is TrialState.RUNNING and not promotion.is_promoted(t)
                  and (below is None or t.number < below))
    return finished_in(trials), running


def _run_trial(ctx: StudyRun, promoted_only: bool = False, target: int | None = None) -> bool | None:
    """Ask for a trial and run it; False when it was a duplicate (told at once, nothing run), None when
    nothing was asked: the queue is empty and the next batch of proposals waits for running trials.

    With ``target``, nothing is asked if the study's finished and running trials reach it once this
    worker holds the ask lock (another local worker may have asked since the count outside it).
    """
    retry_s = ctx.space.study.store_retry_s
    with _ask_lock(ctx.workspace.output_dir), trace.span("ask"):
        if target is not None and sum(_finished_and_running(ctx.study)) >= target:
            return True
        # every trial but a promotion runs a queued proposal: no worker's ask samples (search/proposals.py)
        if not promoted_only and not with_retry(
                lambda: proposals.queue_next(ctx.study, ctx.space.study, lambda t: suggest_policy(ctx.space, t),
                                             target or ctx.space.study.n_trials),
                "queueing the next proposals", budget_s=retry_s):
            return None
        trial = with_retry(ctx.study.ask, "asking Optuna for a trial", budget_s=retry_s)
        if _not_needed(ctx, trial, promoted_only) or (target is not None and _surplus(ctx, trial, target)):
            return True
        trial.set_user_attr("worker", ctx.worker.to_dict())
        rung, source = trial_rung(ctx.study, ctx.space, trial)
        # suggested under the lock: the next local worker's proposal, and its await_twin below, see these
        # params whole (asked apart, two workers proposing the same policy could each miss the other)
        policy = suggest_policy(ctx.space, trial)
    if ctx.status is not None:
        ctx.status.trial_started(trial.number)
    # one heartbeat from the twin check to the tell: a gap (the MLflow run being started) let another worker
    # waiting on a twin, which checks heartbeats at every poll, fail this live trial as stale (CI, three workers)
    with Heartbeat(optuna_adapter.trial_id(trial), optuna_adapter.storage_of(ctx.study)):
        return _run_asked(ctx, trial, rung, source, policy)


def _run_asked(ctx: StudyRun, trial: optuna.Trial, rung: int, source: optuna.trial.FrozenTrial | None,
               policy: Policy) -> bool:
    """:func:`_run_trial` once the trial is asked: its twin, or its MLflow run, references, probe and tell."""
    retry_s = ctx.space.study.store_retry_s
    if promotion.is_promoted(trial):
        twin = None
    else:  # another worker may be running the same policy: its result is this one's
        with trace.span("twin check"):
            twin = await_twin(ctx.study, trial, rung, min(2.0, ctx.space.study.heartbeat_s),
                              lambda: ctx.stop.requested, lambda: _fail_stale(ctx.study, ctx.space.study.store_retry_s))
    if twin is not None:  # probes are seeded: the same params would give the same result again
        tell_duplicate(ctx.study, trial, twin, retry_s)
        say(ctx, f"trial {trial.number}: the same policy as trial {twin.number}, already scored; told its "
                  "result, not run again and not counted")
        return False
    if ctx.stop.requested:  # Ctrl-C came while it was asked: no MLflow run and no probe to start and kill
        _abandon(ctx, trial, None, "interrupted (the run was stopped)")
        raise ProbeInterrupted(f"trial {trial.number}: stopped before its probe started")
    if REQUEUED_FROM in trial.user_attrs:
        say(ctx, f"trial {trial.number} runs the params of trial {trial.user_attrs[REQUEUED_FROM]} again "
                  "(queued when that one was interrupted)")
    with trace.span("MLflow run start"):
        run_id = ctx.tracker.start_trial(trial.number, trial.params, worker=str(ctx.worker))
        trial.set_user_attr("mlflow_run_id", run_id)
    try:
        with trace.span("references"):
            reference = _reference(ctx, policy, rung)
        leg = trial_leg(ctx.space, ctx.workspace.output_dir, trial.number, rung, source)
        if source is not None and leg.resume_from is None:
            say(ctx, f"trial {trial.number}: no checkpoint of trial {source.number} here; "
                      f"running its {rung} steps from step 0")
        if (notice := ctx.sides.begin(policy.clip_grad, trial.number)) is not None:
            say(ctx, notice)  # the probe process makes the reading's BF16 side first, and keeps it
        with trace.span("trial probe", trial=trial.number):
            result = _probe(ctx, policy, f"trial {trial.number}", rung_probe(ctx.space, rung),
                            trial=trial.number, leg=leg)
        stressed = _stressed_result(ctx, trial, policy, source)
        reference = replace(reference, standard=_standard(ctx, policy, trial.number))
    except (UserError, KeyboardInterrupt):
        _abandon(ctx, trial, run_id, "interrupted (the run was stopped)")
        raise
    except Exception as exc:  # a probe that crashes is a failed trial, not a failed study
        reason = f"{type(exc).__name__}: {exc}" if not str(exc).startswith("probe process") else str(exc)
        trial.set_user_attr("fail_reason", reason)
        ctx.tracker.fail_trial(run_id, reason)
        with_retry(lambda: ctx.study.tell(trial, state=TrialState.FAIL), "recording the trial", budget_s=retry_s)
        say(ctx, f"trial {trial.number} failed: {reason}")
        return True
    try:
        with trace.span("record", trial=trial.number):
            record(ctx, trial, run_id, policy, result, reference, stressed, rung)
    except KeyboardInterrupt:  # a second Ctrl-C while recording: close the trial unless Optuna has it
        if optuna_adapter.reread(ctx.study, trial).state is TrialState.RUNNING:
            _abandon(ctx, trial, run_id, "interrupted (the run was stopped)")
        raise
    return True


def _not_needed(ctx: StudyRun, trial: optuna.Trial, promoted_only: bool) -> bool:
    """Close (FAIL, uncounted, unlogged) a trial :func:`~precsearch.search.rungs.unneeded` says not to run."""
    reason = unneeded(ctx.study, ctx.space, trial.number, promoted_only)
    return reason is not None and _close_unneeded(ctx.study, trial, reason, ctx.space.study.store_retry_s)


def _surplus(ctx: StudyRun, trial: optuna.Trial, target: int) -> bool:
    """Close a trial that the study's finished trials and the running ones asked before it already make up
    to ``target``.

    Workers of one output directory count under the ask lock, from one read of the study
    (:func:`_finished_and_running`), and never get here; workers on other machines can each count below
    the target, then all ask. The storage numbers trials in order, so
    the later askers see the earlier ones running and stand down: the study ends with ``n_trials``.
    """
    if promotion.is_promoted(trial):
        return False
    retry_s = ctx.space.study.store_retry_s

    def made_up() -> bool:
        return sum(_finished_and_running(ctx.study, below=trial.number)) >= target

    if not with_retry(made_up, "reading the study", budget_s=retry_s):
        return False
    queued = with_retry(lambda: optuna_adapter.queued_params(optuna_adapter.reread(ctx.study, trial)),
                        "reading the trial", budget_s=retry_s)
    _close_unneeded(ctx.study, trial, f"surplus: {target} trials were finished or running when it was asked",
                    retry_s)
    if queued is not None:  # params queued to run again (a trial whose worker died) stay queued
        place = {k: v for k, v in trial.user_attrs.items() if k == proposals.PROPOSAL}
        with_retry(lambda: ctx.study.enqueue_trial(queued, user_attrs=place), "queueing the trial again",
                   budget_s=retry_s)
    return True


def _close_unneeded(study: optuna.Study, trial: optuna.Trial, reason: str, retry_s: float) -> bool:
    trial.set_user_attr("not_needed", reason)
    with_retry(lambda: study.tell(trial, state=TrialState.FAIL), "recording the trial", budget_s=retry_s)
    return True


@contextmanager
def _ask_lock(output_dir: Path):
    """One ``ask`` (and the trial's suggestions) at a time among the workers sharing this output directory.

    Taking a queued (WAITING) trial relies on ``SELECT ... FOR UPDATE``, which sqlite ignores: two
    local workers asking at once could both take the same queued trial and run it twice (seen in
    the resume test). PostgreSQL locks the row itself; the file lock costs nothing there.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(output_dir / "ask.lock"):
        yield


#: User attribute of a queued trial: the number of the interrupted trial whose params it runs again.
REQUEUED_FROM = "requeued_from"


def _requeue(study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial) -> None:
    """Queue ``trial``'s params (and rung, for a promoted trial) to run again, once.

    Optuna's skip_if_exists would also skip it for the failed trial itself.
    """
    keep = (promotion.FIDELITY, promotion.PROMOTED_FROM, proposals.PROPOSAL)  # a proposal keeps its place
    attrs = {k: v for k, v in trial.user_attrs.items() if k in keep}
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    # a queued trial has no params yet: compare the params it is queued with
    if not any(optuna_adapter.queued_params(t) == trial.params
               and {k: v for k, v in t.user_attrs.items() if k in keep} == attrs for t in waiting):
        # REQUEUED_FROM only names the trial in the line the re-run prints; it is no part of the match above
        study.enqueue_trial(trial.params, user_attrs=attrs | {REQUEUED_FROM: trial.number})


#: Seconds each store write that closes an interrupted trial is retried (a lock another thread of this worker holds,
#: a write an interrupt cut short): long enough for SQLite's lock to pass, short enough that a second Ctrl-C ends
#: the run in seconds.
ABANDON_RETRY_S = 5.0


def _abandon(ctx: StudyRun, trial: optuna.Trial, run_id: str | None, reason: str) -> None:
    """Close a trial the worker is stopping in (Ctrl-C, SIGTERM, a store gone): FAIL, queued again.

    Its study writes are retried on store errors for :data:`ABANDON_RETRY_S` each; one that still fails is said
    in a line (not a traceback) and left to the next run, which fails a trial left RUNNING and queues its params
    again (:func:`recover_dead_trials`).

    The MLflow run (``run_id``; None where none was started) gets one attempt only: a worker told to stop must
    not wait out the retry budget. If it fails, the next ``precsearch run`` closes the run (its worker is gone
    by then).
    """
    steps = ((lambda: trial.set_user_attr("interrupted", True)),
             (lambda: ctx.study.tell(trial, state=TrialState.FAIL)), (lambda: _requeue(ctx.study, trial)))
    with deferred_signals():
        try:  # each step on its own, so a retried one is never one that went through
            for step in steps:
                with_retry(step, f"closing trial {trial.number}", budget_s=ABANDON_RETRY_S, say=None)
        except Exception as exc:  # noqa: BLE001 - a stopping worker must not end in a store's traceback
            say(ctx, f"trial {trial.number} interrupted; the study could not close it now ({first_line(exc)}): "
                      "the next run marks it failed and queues its params again")
            return
    say(ctx, f"trial {trial.number} interrupted: marked failed, its params queued to run again when the study "
              "resumes")
    if run_id is None:
        return
    try:
        ctx.tracker.fail_trial(run_id, reason, "KILLED", retry=False)
    except Exception as exc:  # noqa: BLE001 - best effort, see above
        say(ctx, f"trial {trial.number}: could not close its MLflow run now ({type(exc).__name__}); "
                  "the next run will")


def _reference(ctx: StudyRun, policy: Policy, rung: int) -> References:
    """The BF16 references (every seed at ``rung`` steps, and the stress lr) for ``policy``'s gradient clipping."""
    baseline = ctx.space.baseline_knobs()
    reference = Policy.bf16(policy.clip_grad, baseline)
    told = []

    def run(probe: ProbeSection, label: str, leg: Leg | None) -> ProbeResult:
        if not told:  # only when one is not cached: say why BF16 probes run between trials
            told.append(True)
            say(ctx, terminal.reference_notice(policy.clip_grad, ctx.space.objectives.reference_seeds, rung,
                                                stress_probe(ctx.space) is not None))
        return _probe(ctx, reference, label, probe, leg=leg, kind="reference")

    start, probed = time.monotonic(), ctx.status.eta.probe_seconds() if ctx.status is not None else 0.0
    references = gather_references(ctx.space, ctx.references, ctx.device, policy.clip_grad, run, steps=rung)
    if ctx.status is not None:  # waiting on references another worker runs: their time is not this trial's
        ctx.status.eta.waited(time.monotonic() - start - (ctx.status.eta.probe_seconds() - probed))
    ctx.regime.check(references.seeds, policy.clip_grad, rung)
    return references


def _standard(ctx: StudyRun, policy: Policy, trial: int) -> dict | None:
    """The standard FP8 recipe's reading at ``policy``'s clipping value (:mod:`precsearch.runtime.standard`), read in
    the probe process the first time the study needs it, after the trial's own reading made the BF16 side there;
    None where the study reads none."""
    if ctx.standard is None or not ctx.standard.on:
        return None

    def read() -> ProbeResult:
        say(ctx, ctx.standard.notice(policy.clip_grad, trial))
        start = time.monotonic()
        baseline = Policy.bf16(policy.clip_grad, ctx.space.baseline_knobs())  # its clip value and optimizer state
        try:
            return ctx.executor.run(ctx.space.probe, baseline, f"trial {trial}: the standard FP8 recipe",
                                    standard=True)
        finally:
            if ctx.status is not None:  # one reading per clip value: not a cost of every trial left
                ctx.status.eta.waited(time.monotonic() - start)

    with trace.span("standard FP8 reading", trial=trial):
        return ctx.standard.reading(policy.clip_grad, read)


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
           trial: int | None = None, leg: Leg | None = None, kind: str = "trial") -> ProbeResult:
    """Run one probe of ``policy`` in the probe process; ``probe`` overrides the space's probe section
    (another seed, a stress lr, a rung's steps), ``leg`` continues a run; ``kind`` (``trial``,
    ``reference``) is what the ETA times it as. Raises ProbeFailed / ProbeCrashed when it produced no
    result."""
    probe = probe or ctx.space.probe
    steps = terminal.probe_bar(probe.steps, label, ctx.progress)

    def on_step(step: int, loss: float, grad_norm: float) -> None:
        steps.update(1)
        steps.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if ctx.status is not None:
            ctx.status.tick()

    start = time.monotonic()
    try:
        result = ctx.executor.run(probe, policy, label, on_step, trial=trial, leg=leg)
    finally:
        steps.close()
    if ctx.status is not None:
        # a reading's BF16 side (its first at a clipping value) is timed apart: a trial rate holding it would
        # multiply it by every trial left
        side_s = ctx.sides.seconds_in(result) if kind == "trial" else 0.0
        if side_s > 0:
            ctx.status.eta.probe_done("bf16_side", ctx.space.probe.steps, side_s)
        ctx.status.eta.probe_done(kind, len(result.losses), time.monotonic() - start - side_s)
    return result


