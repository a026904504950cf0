"""One worker's study session: the stores, tracker and probe process a worker's trials share.

:func:`open_run` opens them (and closes them after); :class:`StudyRun` carries them through the loop
(:mod:`precsearch.runtime._optimize`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import optuna
import torch
from filelock import FileLock

from precsearch.arch.config import ModelConfig
from precsearch.backends import BackendUnavailable, resolve_device
from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.runtime import progress as terminal
from precsearch.runtime import stores
from precsearch.runtime.executor import ProbeExecutor, probe_process
from precsearch.runtime.liveness import WorkerId
from precsearch.runtime.recorder import Recorder
from precsearch.runtime.lost_stores import lost_runs
from precsearch.runtime.reference import ReferenceCache
from precsearch.runtime.study_log import say
from precsearch.runtime.stopping import StopRequest
from precsearch.runtime.study_store import open_study as _open_study
from precsearch.runtime.study_store import run_ids as _run_ids
from precsearch.runtime.workspace import Workspace
from precsearch.search import guided
from precsearch.tracking import Tracker
from precsearch.utils import trace
from precsearch.utils.processes import quick_exit


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
    sensitivity: guided.SensitivityTable | None = None  # per-unit effects, with search.sensitivity
    regime_checked: set = field(default_factory=set)  # (clip_grad, rung) whose references had the regime check
    bf16_sides: set = field(default_factory=set)  # clip_grad values whose reading's BF16 side this probe process made
    recorder: Recorder | None = None  # writes told trials to MLflow off the probe loop (runtime/recorder.py)



@contextmanager
def open_run(space: Space, ws: Workspace, progress: bool, *, space_text: str | None = None,
             parent_id: str | None = None, probes: bool = True, name: str = "", sampler_offset: int = 0,
             executor: ProbeExecutor | None = None):
    """Open the study's storage, MLflow tracker and (with ``probes``) a probe process; close them after.

    The probe process starts first: it imports torch and the backend (Transformer Engine: about 12 s)
    while the stores open, rather than when the first probe is asked for. ``executor`` is one started
    earlier still (:func:`probe_process`, before the space's checks on this machine): it is used and closed.
    """
    quick_exit()  # Ctrl-C ends within a second: not after seconds of freeing torch and MLflow at exit
    stop = StopRequest()
    if executor is not None:
        executor.watch(lambda: stop.requested)
    elif probes:
        executor = probe_process(space, lambda: stop.requested)
    try:
        yield from _open_with(space, ws, progress, executor, stop, space_text=space_text, parent_id=parent_id,
                              name=name, sampler_offset=sampler_offset)
    finally:
        if executor is not None:
            executor.close()


def _open_with(space: Space, ws: Workspace, progress: bool, executor: ProbeExecutor | None, stop: StopRequest, *,
               space_text: str | None, parent_id: str | None, name: str, sampler_offset: int):
    opened = time.time()
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
    ctx.stop._say = lambda message: say(ctx, message)
    stale = getattr(storage, "get_heartbeat_stale_trial_callback", lambda: None)()
    if stale is not None:
        stale.tracker, stale.say = tracker, (lambda message: say(ctx, message))
    if space_text is not None:  # the run command's driver: the directory is this study's from now on
        ws.save()
        tracker.log_space(space_text, {"study": space.study.name, "backend": space.backend.value,
                                       "device": str(device), "probe_layers": ctx.cfg.n_layers,
                                       "probe_steps": space.probe.steps})
    ctx.run_ids = _run_ids(study)
    ctx.sensitivity = guided.table_of(study)
    ctx.lost_runs = lost_runs(tracker, ctx.run_ids, lambda message: say(ctx, message))
    ctx.run_ids = {n: r for n, r in ctx.run_ids.items() if r not in ctx.lost_runs}
    trace.write("open stores", opened, time.time())
    with ctx.stop:
        yield ctx


def start_guided(ctx: StudyRun) -> None:
    """With ``search.sensitivity``: the sensitivity pass and its queued candidates (:mod:`precsearch.search.guided`)."""
    log = lambda name, data: ctx.tracker.log_bytes(ctx.tracker.parent_id, data, name)  # noqa: E731
    ctx.sensitivity = guided.start(ctx.space, ctx.study, ctx.device, log, lambda message: say(ctx, message))
