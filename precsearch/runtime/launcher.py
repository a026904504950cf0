"""``precsearch run --workers N`` / ``--gpus``: one study, several local worker processes.

The driver (this module) opens the study and its MLflow parent run, recovers
trials of dead workers, then starts one ``precsearch worker`` process per
worker (per GPU slice of ``probe.nproc`` GPUs, with ``CUDA_VISIBLE_DEVICES``
set), and shows progress from the storage until they finish. When MLflow
tracking goes to a local sqlite file, the driver serves it with a local
``mlflow server`` so that the workers log over HTTP, not into one sqlite file.

Workers run in their own process group and die with the driver. Ctrl-C
reaches the driver only, which passes it on: the first asks each worker to
stop its probe in flight and queue its trial again, the second stops them at once.

The workers' output comes through the driver (:class:`Relay`), one line at a time above its
progress bar; what the driver says once for the whole run (the stop notice, the resume hint, the
end) is not repeated for each worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import nullcontext

from tqdm import tqdm

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.runtime._optimize import recover_dead_trials
from precsearch.runtime.front_update import update_front
from precsearch.runtime.progress import compile_notice
from precsearch.runtime.study_log import say
from precsearch.runtime.session import open_run, start_guided
from precsearch.runtime.stopping import RESUME_HINT, STOP_NOTICE, WORKER_DONE
from precsearch.runtime.worker import STORAGE_ENV
from precsearch.runtime.workspace import Workspace
from precsearch.search import proposals
from precsearch.search.front import trial_rows
from precsearch.search.scoring import objective_names
from precsearch.search.summary import finished_count
from precsearch.tracking.local_server import LocalTrackingServer
from precsearch.utils.cpu_threads import THREADS_ENV, choose_threads
from precsearch.utils.log import logger
from precsearch.utils.processes import dying_with_parent


def gpu_slices(gpus: list[int], per_worker: int) -> list[list[int]]:
    """Split ``gpus`` into groups of ``per_worker`` (one group per worker); leftovers are refused."""
    if len(gpus) % per_worker:
        raise UserError(f"{len(gpus)} GPUs cannot be split into groups of probe.nproc={per_worker}",
                        field="--gpus")
    return [gpus[i:i + per_worker] for i in range(0, len(gpus), per_worker)]


def run_parallel(space: Space, space_text: str, ws: Workspace, target: int, *, workers: int,
                 gpus: list[int] | None, progress: bool) -> list[dict]:
    """Run the study in parallel worker processes; return the final trial rows."""
    slices = gpu_slices(gpus, space.probe.nproc) if gpus else [None] * workers
    with open_run(space, ws, progress, space_text=space_text, probes=False) as ctx:
        proposals.set_batch_size(ctx.study, len(slices))  # before any worker proposes
        recover_dead_trials(ctx)
        start_guided(ctx)
        say(ctx, f"study '{space.study.name}': {finished_count(ctx.study)} of {target} trials finished; "
                 f"starting {len(slices)} workers; output in {ws.output_dir}")
        if (notice := compile_notice(space.backend.value, space.probe.device)) is not None:
            say(ctx, notice)
        local = ws.tracking_uri.startswith("sqlite:")
        server = LocalTrackingServer(ws.tracking_uri, ws.output_dir / "mlflow-server.log") if local else nullcontext(
            ws.tracking_uri)
        try:
            with server as tracking_uri:
                # CPU workers share the free cores: measured once for all of them (utils/cpu_threads.py)
                threads = None if gpus else choose_threads(processes=len(slices))
                procs = [_start_worker(ws, tracking_uri, target, i, gpu, threads) for i, gpu in enumerate(slices)]
                codes = _watch(ctx, procs, target, progress)
                if local and ctx.stop.requested:  # every worker has exited: nothing is mid-write through it
                    server.stop(grace_s=0.0)
        except KeyboardInterrupt:
            ctx.tracker.close_stopped(lambda line: say(ctx, line))
            raise
        stopped = ctx.stop.requested or any(c == 130 for c in codes)
        if stopped:  # the front's files are the resumed run's to update: Ctrl-C ends within a second
            ctx.tracker.close_stopped(lambda line: say(ctx, line))
            raise KeyboardInterrupt
        update_front(ctx)
        done = finished_count(ctx.study)
        ctx.tracker.close("FINISHED" if done >= target else "KILLED")
        if done < target:
            raise UserError(f"the workers stopped with {done} of {target} trials finished (exit statuses "
                            f"{codes}); see their messages above; re-run to resume", field="study.n_trials")
        return trial_rows(ctx.study, objective_names(space.objectives))


def _start_worker(ws: Workspace, tracking_uri: str, target: int, index: int,
                  gpus: list[int] | None, threads: int | None = None) -> subprocess.Popen:
    """One worker process: on ``gpus``, or on the CPU with ``threads`` threads (None: the user's setting)."""
    env = os.environ | {STORAGE_ENV: ws.storage_url, "MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    elif threads is not None:
        env[THREADS_ENV] = str(threads)
    cmd = [sys.executable, "-m", "precsearch", "worker", "--study", ws.study_name, "--output-dir",
           str(ws.output_dir), "--n-trials", str(target), "--name", f"w{index}", "--no-progress"]
    return start_relayed(dying_with_parent(cmd), env)


def start_relayed(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session, its output relayed above the progress bar (``proc.relay``)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.relay = Relay(proc.stdout)
    proc.relay.start()
    return proc


#: Lines a worker ends with, or says on Ctrl-C, that the driver says once for all its workers.
DRIVER_SAYS = (WORKER_DONE, RESUME_HINT)


class Relay(threading.Thread):
    """Writes a worker's output line by line above the driver's progress bar (``tqdm.write``, through the
    ``precsearch`` logger); drops blank lines and those in :data:`DRIVER_SAYS` or the stop notice."""

    def __init__(self, stream, write=None):
        super().__init__(name="precsearch-relay", daemon=True)
        self.stream, self.write = stream, write or logger().info

    def run(self) -> None:
        for raw in self.stream:
            line = raw.decode(errors="replace").rstrip("\r\n").rpartition("\r")[2].rstrip()
            if line and not repeated(line):
                self.write(line)


def repeated(line: str) -> bool:
    """Whether a worker's ``line`` is one the driver says once for all workers."""
    return line.startswith(DRIVER_SAYS) or line.endswith(STOP_NOTICE)


def _watch(ctx, procs: list[subprocess.Popen], target: int, progress: bool) -> list[int]:
    """Wait for the workers, showing finished trials; pass Ctrl-C on (within 0.1 s). Returns their exit
    statuses."""
    # no remaining-time estimate here: tqdm's counts the BF16 references as trial time (the naive estimate
    # precsearch.runtime.progress.Eta replaces); each worker's status line gives the study's ETA
    bar = tqdm(total=target, desc="trials", unit="trial", disable=not progress,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}]")
    forwarded, counted = False, 0.0
    try:
        while any(p.poll() is None for p in procs):
            if ctx.stop.requested and not forwarded:
                _signal_all(procs, signal.SIGINT)
                forwarded = True
            if not forwarded and time.monotonic() - counted >= 1.0:  # a storage read a second, not ten
                bar.n = min(target, finished_count(ctx.study))
                bar.refresh()
                counted = time.monotonic()
            time.sleep(0.1)
    except KeyboardInterrupt:  # a second Ctrl-C (or SIGTERM): stop the workers now
        _signal_all(procs, signal.SIGTERM)
        for p in procs:
            p.wait()
        raise
    finally:
        for p in procs:  # a worker's last lines before the driver's (its probe process may hold the pipe a moment)
            p.relay.join(timeout=0.5)
        bar.close()
    return [p.returncode for p in procs]


def _signal_all(procs: list[subprocess.Popen], signum: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


def parse_gpus(text: str | None) -> list[int] | None:
    """``"0,1,3"`` -> [0, 1, 3]; ``"all"`` -> every visible GPU; None -> None."""
    if text is None:
        return None
    if text == "all":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise UserError("--gpus all: no CUDA GPU is visible; on CPU use --workers N", field="--gpus")
        return list(range(count))
    try:
        gpus = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise UserError(f"--gpus takes 'all' or a list like 0,1,2 (got '{text}')", field="--gpus") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise UserError(f"--gpus needs distinct GPU indices >= 0 (got '{text}')", field="--gpus")
    return gpus


__all__ = ["run_parallel", "parse_gpus", "gpu_slices"]
