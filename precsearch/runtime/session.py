"""One worker's study session: the stores, tracker and probe process a worker's trials share.

:func:`open_run` opens them (and closes them after); :class:`StudyRun` holds them, with the run's frozen
:class:`StudyConfig` and the objects that keep the loop's state (:mod:`precsearch.runtime._optimize`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import optuna
import torch
from filelock import FileLock

from precsearch.backends import BackendUnavailable, resolve_device
from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.readings import SideRuns, get_reading
from precsearch.runtime import progress as terminal
from precsearch.runtime import stores
from precsearch.runtime.executor import ProbeExecutor, probe_process
from precsearch.runtime.liveness import WorkerId
from precsearch.runtime.recorder import Recorder
from precsearch.runtime.lost_stores import lost_runs
from precsearch.runtime.reference import ReferenceCache
from precsearch.runtime.regime_gate import RegimeGate
from precsearch.runtime.study_log import say
from precsearch.runtime.standard import StandardReadings
from precsearch.runtime.stopping import StopRequest
from precsearch.runtime.study_store import open_study as _open_study
from precsearch.runtime.study_store import run_ids as _run_ids
from precsearch.runtime.workspace import Workspace
from precsearch.search import guided
from precsearch.tracking import Tracker
from precsearch.utils import trace
from precsearch.utils.processes import quick_exit


@dataclass(frozen=True)
class StudyConfig:
    """What one worker's run of a study is, fixed for its life.

    Attributes:
        space: The study's space.
        workspace: Its output directory and stores.
        device: The device its probes run on (``probe.device`` resolved).
        worker: This process, as trials record their worker.
        name: The worker's name (``w1``), starting its lines; "" for the only one.
        progress: Progress bars (else a line after each trial).
    """

    space: Space
    workspace: Workspace
    device: torch.device
    worker: WorkerId
    name: str = ""
    progress: bool = True


@dataclass
class StudyRun:
    """One worker's open study: its configuration, what :func:`open_run` opened, and the state each part keeps.

    Nothing here is a bare container the loop fills in: the reading's BF16 sides are the reading's
    (:meth:`~precsearch.readings.StabilityReading.side_runs`), the regime checks already made the gate's
    (:class:`~precsearch.runtime.regime_gate.RegimeGate`), the records not yet written the recorder's. The
    configuration's fields read through (``ctx.space`` is ``ctx.config.space``).

    Attributes:
        config: What this run is (frozen).
        study, tracker, executor, references, stop: The Optuna study, the MLflow tracker, the probe process
            (None for a driver that runs no probe), the BF16 reference cache, the stop request.
        lost_runs: MLflow run ids the study records but the tracking store lacks (found once, at open).
        sides: The stability reading's BF16 sides in this worker's probe process.
        regime: The regime checks of this worker's references.
        sensitivity: Per-unit effects, with ``search.sensitivity`` (None otherwise).
        standard: The standard FP8 recipe's readings the trials are set beside (off unless the reading asks).
        status: The terminal's status line, while :func:`~precsearch.runtime._optimize.work` runs.
        recorder: Writes told trials to MLflow off the probe loop, once the first is told.
    """

    config: StudyConfig
    study: optuna.Study
    tracker: Tracker
    executor: ProbeExecutor | None
    references: ReferenceCache
    stop: StopRequest
    lost_runs: frozenset[str]
    sides: SideRuns
    regime: RegimeGate
    sensitivity: guided.SensitivityTable | None = None
    standard: StandardReadings | None = None
    status: terminal.StudyStatus | None = None
    recorder: Recorder | None = None

    @property
    def space(self) -> Space:
        return self.config.space

    @property
    def workspace(self) -> Workspace:
        return self.config.workspace

    @property
    def device(self) -> torch.device:
        return self.config.device

    @property
    def worker(self) -> WorkerId:
        return self.config.worker

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def progress(self) -> bool:
        return self.config.progress


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
    config = StudyConfig(space=space, workspace=ws, device=device, worker=WorkerId.current(), name=name,
                         progress=progress)
    say_ = lambda message: say(config, message)  # noqa: E731
    reading = get_reading(space.objectives.reading)
    ctx = StudyRun(config=config, study=study, tracker=tracker, executor=executor,
                   references=ReferenceCache(ws.references_dir), stop=stop,
                   lost_runs=frozenset(lost_runs(tracker, _run_ids(study), say_)),
                   sides=reading.side_runs(space.search.clip_grad.options(), space.probe.steps),
                   regime=RegimeGate(space, say_), sensitivity=guided.table_of(study))
    ctx.standard = StandardReadings(space, ctx.references, device, say_, tracker.tag_study)
    ctx.stop._say = say_
    stale = getattr(storage, "get_heartbeat_stale_trial_callback", lambda: None)()
    if stale is not None:
        stale.tracker, stale.say = tracker, say_
    if space_text is not None:  # the run command's driver: the directory is this study's from now on
        ws.save()
        tracker.log_space(space_text, {"study": space.study.name, "backend": space.backend.value,
                                       "device": str(device), "probe_layers": space.model.probe().n_layers,
                                       "probe_steps": space.probe.steps})
    trace.write("open stores", opened, time.time())
    with ctx.stop:
        yield ctx


def start_guided(ctx: StudyRun) -> None:
    """With ``search.sensitivity``: the sensitivity pass and its queued candidates (:mod:`precsearch.search.guided`)."""
    log = lambda name, data: ctx.tracker.log_bytes(ctx.tracker.parent_id, data, name)  # noqa: E731
    ctx.sensitivity = guided.start(ctx.space, ctx.study, ctx.device, log, lambda message: say(ctx, message))
