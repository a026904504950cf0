"""The Optuna driver: ask a policy, run its probe, score it, tell Optuna, log to MLflow.

It uses Optuna's ask-and-tell interface so that each trial is one plain loop
iteration: the probe, the scoring, the MLflow run and the Pareto update stay
readable in one place. A study is resumable: the same command finds the same
study in its storage, marks trials a killed run left RUNNING as failed (and
re-queues their params), and runs only the trials still missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import torch
import yaml
from optuna.trial import TrialState
from tqdm import tqdm

from precsearch.backends import Backend, BackendUnavailable, get_backend, resolve_device
from precsearch.config.space import ProbeSection, Space
from precsearch.errors import UserError
from precsearch.policy import MemoryKnobs, Policy
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.model import ModelConfig
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import run_probe
from precsearch.search import stores
from precsearch.search.front import format_table, policy_summary, trial_rows
from precsearch.search.reference import ReferenceCache, reference_key
from precsearch.search.sampling import suggest_policy
from precsearch.search.scoring import DIRECTIONS, constraint_value, objective_names, objective_values, score
from precsearch.search.workspace import Workspace
from precsearch.tracking import Tracker
from precsearch.tracking.front_report import write_front


@dataclass
class StudyRun:
    """Everything a trial needs, built once per ``precsearch run``."""

    space: Space
    workspace: Workspace
    study: optuna.Study
    tracker: Tracker
    backend: Backend
    device: torch.device
    data: TokenBatches
    cfg: ModelConfig
    references: ReferenceCache
    progress: bool = True
    run_ids: dict[int, str] = field(default_factory=dict)


def run_study(space: Space, space_text: str, output_dir: Path | None = None, *,
              n_trials: int | None = None, progress: bool = True) -> list[dict]:
    """Run (or resume) the study a space file describes; return the final trial rows."""
    ctx = _open(space, space_text, output_dir, progress)
    target = n_trials or space.study.n_trials
    todo = target - _finished_count(ctx.study)
    _say(ctx, f"study '{space.study.name}': {target - todo} of {target} trials already finished; "
              f"output in {ctx.workspace.output_dir}")
    bar = tqdm(total=target, initial=target - todo, desc="trials", unit="trial", disable=not progress)
    try:
        for _ in range(max(0, todo)):
            _run_trial(ctx)
            bar.update(1)
    except KeyboardInterrupt:
        ctx.tracker.close("KILLED")
        raise
    finally:
        bar.close()
    _update_front(ctx)  # also after a resume with nothing left to run: a kill may have come before the update
    ctx.tracker.close("FINISHED")
    return trial_rows(ctx.study, objective_names(space.objectives))


def _open(space: Space, space_text: str, output_dir: Path | None, progress: bool) -> StudyRun:
    ws = Workspace.for_space(space, output_dir)
    ws.save()
    storage = stores.open_storage(ws.storage_url)
    tracker = stores.open_tracker(ws)
    study = _open_study(space, storage)
    try:
        device = resolve_device(space.probe.device)
        backend = get_backend(space.backend.value, device)
    except BackendUnavailable as exc:
        raise UserError(str(exc), field="backend") from None
    ctx = StudyRun(space=space, workspace=ws, study=study, tracker=tracker, backend=backend, device=device,
                   data=load_batches(space), cfg=space.model.probe(), references=ReferenceCache(ws.references_dir),
                   progress=progress)
    tracker.log_space(space_text, {"study": space.study.name, "backend": backend.name, "device": str(device),
                                   "probe_layers": ctx.cfg.n_layers, "probe_steps": space.probe.steps})
    ctx.run_ids = {t.number: t.user_attrs["mlflow_run_id"] for t in study.get_trials(deepcopy=False)
                   if "mlflow_run_id" in t.user_attrs}
    _recover_interrupted(ctx)
    return ctx


def _open_study(space: Space, storage: optuna.storages.BaseStorage) -> optuna.Study:
    names = objective_names(space.objectives)
    directions = [DIRECTIONS[n] for n in names]
    study = optuna.create_study(study_name=space.study.name, storage=storage, directions=directions,
                                sampler=stores.make_sampler(space.study), load_if_exists=True)
    stored = study.user_attrs.get("objectives")
    if stored is None:
        study.set_user_attr("objectives", names)
        study.set_user_attr("space", space.model_dump(mode="json"))
    elif stored != names:
        raise UserError(f"study '{space.study.name}' in this storage optimises {stored}, not {names}; "
                        f"use another study.name or --output-dir", field="study.name")
    return study


def _finished_count(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
               if not t.user_attrs.get("interrupted"))


def _recover_interrupted(ctx: StudyRun) -> None:
    """Trials a killed run left RUNNING: mark failed, close their MLflow run, queue their params again."""
    for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        ctx.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        ctx.study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        if t.user_attrs.get("mlflow_run_id"):
            ctx.tracker.fail_trial(t.user_attrs["mlflow_run_id"], "interrupted (the run was stopped)", "KILLED")
        _requeue(ctx.study, t.params)
        _say(ctx, f"trial {t.number} was interrupted by an earlier run: marked failed, its params queued again")
    ctx.tracker.close_orphans(set(ctx.run_ids.values()))


def load_batches(space: Space) -> TokenBatches:
    """The space's token stream as deterministic training batches plus the fixed held-out set."""
    d, p = space.data, space.probe
    tokens = load_tokens(d.source.value, path=d.path, tokenizer=d.tokenizer, dtype=d.dtype,
                         max_tokens=d.max_tokens, seed=p.seed, vocab_size=space.model.probe().vocab_size)
    return TokenBatches(tokens, seq_len=p.seq_len, micro_batch=p.micro_batch, seed=p.seed,
                        eval_batches=d.eval_batches)


def _run_trial(ctx: StudyRun) -> None:
    trial = ctx.study.ask()
    policy = suggest_policy(ctx.space, trial)
    run_id = ctx.tracker.start_trial(trial.number, trial.params)
    trial.set_user_attr("mlflow_run_id", run_id)
    ctx.run_ids[trial.number] = run_id
    try:
        reference = _reference(ctx, policy)
        twin = _finished_twin(ctx.study, trial.params)
        if twin is not None:  # probes are seeded: the same params would give the same result again
            trial.set_user_attr("duplicate_of", twin.number)
            result = ProbeResult.from_dict(twin.user_attrs["probe_result"])
        else:
            result = _probe(ctx, policy, f"trial {trial.number}")
    except (UserError, KeyboardInterrupt):
        _abandon(ctx, trial, run_id, "interrupted (the run was stopped)")
        raise
    except Exception as exc:  # a probe that crashes is a failed trial, not a failed study
        reason = f"{type(exc).__name__}: {exc}"
        trial.set_user_attr("fail_reason", reason)
        ctx.study.tell(trial, state=TrialState.FAIL)
        ctx.tracker.fail_trial(run_id, reason)
        _say(ctx, f"trial {trial.number} failed: {reason}")
        return
    _record(ctx, trial, run_id, policy, result, reference)


def _requeue(study: optuna.Study, params: dict) -> None:
    """Queue ``params`` to run again, once (Optuna's skip_if_exists would also skip it for the failed trial)."""
    if not any(t.params == params for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))):
        study.enqueue_trial(params)


def _finished_twin(study: optuna.Study, params: dict) -> optuna.trial.FrozenTrial | None:
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.params == params and "probe_result" in t.user_attrs:
            return t
    return None


def _abandon(ctx: StudyRun, trial: optuna.Trial, run_id: str, reason: str) -> None:
    trial.set_user_attr("interrupted", True)
    ctx.study.tell(trial, state=TrialState.FAIL)
    _requeue(ctx.study, trial.params)
    ctx.tracker.fail_trial(run_id, reason, "KILLED")


def _reference(ctx: StudyRun, policy: Policy) -> ProbeResult:
    key = reference_key(ctx.space, policy.clip_grad, ctx.device)
    baseline = MemoryKnobs(**ctx.space.objectives.baseline_memory.model_dump())
    reference = Policy.bf16(policy.clip_grad, baseline)
    return ctx.references.get(key, lambda: _probe(ctx, reference, "BF16 reference"))


def _probe(ctx: StudyRun, policy: Policy, label: str, probe: ProbeSection | None = None) -> ProbeResult:
    """Run one probe of ``policy``; ``probe`` overrides the space's probe section (another seed, a stress lr)."""
    probe = probe or ctx.space.probe
    steps = tqdm(total=probe.steps, desc=label, unit="step", leave=False, disable=not ctx.progress)

    def on_step(step: int, loss: float, grad_norm: float) -> None:
        steps.update(1)
        steps.set_postfix(loss=f"{loss:.3f}", refresh=False)

    try:
        return run_probe(ctx.cfg, probe, policy, ctx.data, ctx.backend, ctx.device, on_step)
    finally:
        steps.close()


def _record(ctx: StudyRun, trial: optuna.Trial, run_id: str, policy: Policy,
            result: ProbeResult, reference: ProbeResult) -> None:
    objectives = ctx.space.objectives
    s = score(result, reference, objectives)
    for key, value in (("score", s.to_dict()), ("policy", policy.to_dict()), ("eval_loss", result.eval_loss),
                       ("peak_memory_bytes", result.peak_memory_bytes), ("memory_source", result.memory_source),
                       ("reason", result.reason), ("probe_result", result.to_dict())):
        trial.set_user_attr(key, value)
    trial.set_constraint("stability", constraint_value(s, objectives))
    # MLflow first, Optuna second: a kill in between leaves the trial RUNNING in Optuna, which the
    # next run marks interrupted (and its MLflow run KILLED); the other order would leave a
    # COMPLETE trial whose MLflow run never finished.
    ctx.tracker.log_steps(run_id, {"train_loss": result.losses, "grad_norm": result.grad_norms})
    ctx.tracker.finish_trial(
        run_id,
        metrics={"memory_saved": s.memory_saved, "instability": s.instability, "loss_gap": s.loss_gap,
                 "tokens_per_s": s.tokens_per_s, "speedup": s.speedup, "spikes": s.spikes,
                 "peak_memory_mib": result.peak_memory_bytes / 2**20, "eval_loss": result.eval_loss,
                 "reference_eval_loss": reference.eval_loss, "wall_s": result.wall_s,
                 "steps_run": len(result.losses), "feasible": float(s.feasible), "diverged": float(s.diverged)},
        tags={"trial_state": "COMPLETE", "feasible": str(s.feasible).lower(), "diverged": str(s.diverged).lower(),
              "memory_source": result.memory_source, "divergence_reason": result.reason or "-",
              "duplicate_of": str(trial.user_attrs.get("duplicate_of", "-"))},
        artifacts={"policy.yaml": yaml.safe_dump(policy.to_dict(), sort_keys=False),
                   "probe_result.json": json.dumps(result.to_dict(), indent=1)},
    )
    ctx.study.tell(trial, objective_values(s, objectives))
    _update_front(ctx)
    verdict = "diverged" if s.diverged else ("feasible" if s.feasible else "unstable")
    _say(ctx, f"trial {trial.number}: memory saved {100 * s.memory_saved:.2f}% ({result.memory_source}), "
              f"instability {100 * s.instability:.3f}% [{verdict}]  {policy_summary(trial.params)}")


def _update_front(ctx: StudyRun) -> None:
    rows = trial_rows(ctx.study, objective_names(ctx.space.objectives))
    front = {r["trial"] for r in rows if r["pareto"]}
    ctx.tracker.set_pareto({r["trial"]: ctx.run_ids[r["trial"]] for r in rows if r["trial"] in ctx.run_ids}, front)
    files = write_front(rows, ctx.workspace.output_dir / "front", ctx.space.objectives.stability_limit)
    ctx.tracker.log_front(files)


def _say(ctx: StudyRun, message: str) -> None:
    if ctx.progress:
        tqdm.write(message)
    else:
        print(message, flush=True)


__all__ = ["run_study", "format_table"]
