"""Running probes in a child process, so that a crash in one cannot take the worker down.

A probe can die in ways Python cannot catch: a segfault in a kernel, a CUDA
error that poisons the context, the kernel's OOM killer. The worker therefore
runs each probe in a long-lived child process (started with ``spawn``, so no
CUDA state is inherited) and talks to it over a pipe: a request per probe,
one message per training step (for the progress bar), then the result. If
the child dies, the probe is reported as :class:`ProbeCrashed` with the
signal or exit code, and a fresh child serves the next probe. The child also
dies with its worker (``PR_SET_PDEATHSIG``) and ignores Ctrl-C, which the
worker handles: when its stop flag is up, the probe in flight is killed within
a poll (0.2 s) and :class:`ProbeInterrupted` raised.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

from precsearch.config.space import ProbeSection, Space
from precsearch.errors import UserError
from precsearch.policy import Policy
from precsearch.probe.continuation import Leg
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import StepCallback
from precsearch.utils import trace
from precsearch.utils.processes import die_with_parent, dump_stacks_on_signal

#: Exceptions after which the child's CUDA context (or heap) cannot be trusted: start a fresh child.
_POISONING = ("OutOfMemoryError", "AcceleratorError", "CudaError", "MemoryError")


class ProbeFailed(RuntimeError):
    """The probe raised an exception (the message names its type)."""


class ProbeCrashed(RuntimeError):
    """The probe's process died (signal, exit code) or ran past its time limit."""


class ProbeSetupFailed(UserError):
    """The probe process could not load the space's data (or backend): no probe of this study can run.

    A user error, not a verdict on the trial's policy: the trial is queued again and the run stops.
    """


class ProbeInterrupted(KeyboardInterrupt):
    """The worker was asked to stop (Ctrl-C, SIGTERM) while a probe ran; the probe was killed."""


class ProbeExecutor:
    """Runs probes of one space in a child process, one at a time.

    Args:
        space: The study's space (the child loads its data and backend once).
        timeout_s: Kill a probe that runs longer than this (None: no limit).
        stop_requested: Polled while a probe runs; when it answers True the probe is killed and
            :class:`ProbeInterrupted` raised (None: never).
    """

    def __init__(self, space: Space, timeout_s: float | None = None,
                 stop_requested: Callable[[], bool] | None = None):
        self._space = space
        self._space_json = space.model_dump(mode="json")
        self.timeout_s = timeout_s
        self._stop_requested = stop_requested or (lambda: False)
        self._ctx = mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._released: list[mp.process.BaseProcess] = []  # children told to exit, not waited for yet

    def run(self, probe: ProbeSection, policy: Policy, label: str, on_step: StepCallback | None = None,
            trial: int | None = None, leg: Leg | None = None, standard: bool = False) -> ProbeResult:
        """Run one probe; raises ProbeFailed or ProbeCrashed when it does not produce a result.

        ``leg`` makes it a stretch of a longer run (:mod:`precsearch.probe.continuation`). ``standard`` asks
        instead for the standard FP8 recipe's fixed-state reading at ``policy``'s clipping value, and no probe
        (:meth:`~precsearch.runtime.probe_host.ProbeHost.read_standard`).

        A probe of ``probe.nproc`` > 1 processes is launched with torchrun instead (its own processes
        give the same isolation).
        """
        if getattr(probe, "nproc", 1) > 1:
            from precsearch.probe.parallel.distributed import run_distributed_probe

            return run_distributed_probe(self._space, probe, policy, label, on_step=on_step, timeout=self.timeout_s)
        self._ensure_child()
        self._conn.send({"probe": probe.model_dump(mode="json"), "policy": policy.to_dict(), "label": label,
                         "trial": trial, "leg": leg.to_dict() if leg else None, "standard": standard})
        start = time.monotonic()
        try:
            while True:
                if self._conn.poll(0.2):
                    message = self._receive()
                    if message[0] == "step":
                        if on_step:
                            on_step(*message[1:])
                    elif message[0] == "done":
                        return ProbeResult.from_dict(message[1])
                    elif message[0] == "setup_error":
                        self._kill()  # a fresh child re-reads the data once the user has fixed it
                        raise ProbeSetupFailed(f"the probe process could not start: {message[2]}",
                                               field=message[1])
                    else:
                        self._after_error(message[1])
                        raise ProbeFailed(f"{message[1]}: {message[2]}")
                elif not self._proc.is_alive():
                    raise ProbeCrashed(self._death_reason())
                if self._stop_requested():
                    self._kill()
                    raise ProbeInterrupted(f"{label}: stopped")
                if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                    self._kill()
                    raise ProbeCrashed(f"probe ran past its time limit of {self.timeout_s:.0f} s and was killed")
        except KeyboardInterrupt:
            self._kill()  # a second Ctrl-C or SIGTERM: stop now
            raise

    def start(self) -> None:
        """Start the child now (it loads the space's data and backend) instead of at the first probe."""
        self._ensure_child()

    def watch(self, stop_requested: Callable[[], bool]) -> None:
        """Poll ``stop_requested`` while a probe runs from now on (for an executor started before its study)."""
        self._stop_requested = stop_requested

    def release(self) -> None:
        """Tell the child to exit and go on without waiting: the OS and the driver take its memory back while
        the study writes its last records (the next probe, if any, starts a fresh child; :meth:`close` waits).
        Call between probes."""
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._released.append(self._proc)
            except (OSError, EOFError):
                self._kill()
        self._proc = None

    def close(self) -> None:
        """Stop the child (it finishes nothing: call between probes), and wait for released ones."""
        self.release()
        for proc in self._released:
            with trace.span("probe process exit"):
                proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        self._released = []

    def __enter__(self) -> "ProbeExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ensure_child(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        parent_end, child_end = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_child_main, args=(child_end, self._space_json, time.time()),
                                       daemon=True, name="precsearch-probe")
        self._proc.start()
        child_end.close()
        self._conn = parent_end

    def _receive(self):
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5)
            raise ProbeCrashed(self._death_reason()) from None

    def _after_error(self, error_type: str) -> None:
        if error_type in _POISONING:
            self._kill()

    def _death_reason(self) -> str:
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        self._proc = None
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = {"SIGKILL": " (out of memory, or killed by another process)",
                    "SIGSEGV": " (segmentation fault)", "SIGABRT": " (aborted)"}.get(name, "")
            return f"probe process killed by {name}{hint}"
        return f"probe process exited with status {code} before it produced a result"

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)
        self._proc = None


def probe_process(space: Space, stop_requested: Callable[[], bool] | None = None) -> ProbeExecutor:
    """The space's probe process, started now: it imports torch and the backend and loads the data while the
    caller goes on (``precsearch run`` starts it before its checks on this machine, which import the same)."""
    executor = ProbeExecutor(space, space.study.trial_timeout_s, stop_requested)
    executor.start()
    return executor


def _child_main(conn, space_json: dict, spawned_at: float | None = None) -> None:
    die_with_parent()
    dump_stacks_on_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides what Ctrl-C means
    trace.set_role("probe")
    if spawned_at is not None:  # the interpreter's start and this module's imports
        trace.write("probe process: start", spawned_at, time.time())
    from precsearch.runtime.probe_host import ProbeHost

    try:
        with trace.span("probe process: set-up"):
            host = ProbeHost(Space.model_validate(space_json))
        setup_error = None
    except Exception as exc:  # noqa: BLE001 - it would recur for every probe: answer each request with it
        host, setup_error = None, ("setup_error", *_setup_problem(exc))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            _exit_now()
        if setup_error is not None:
            conn.send(setup_error)
            continue
        try:
            with trace.span("probe request", label=request.get("label"), trial=request.get("trial")):
                result = host.run(request, on_step=lambda *step: conn.send(("step", *step)))
                conn.send(("done", result.to_dict()))
        except Exception as exc:  # noqa: BLE001 - reported to the worker, which records it
            conn.send(("error", type(exc).__name__, _describe(exc)))
            if type(exc).__name__ in _POISONING:
                os._exit(1)


def _exit_now() -> None:
    """End the probe process without Python's teardown: freeing the kept model, the reading's states (tens of
    GiB of page-locked host memory on a GPU: cudaFreeHost is slow) and the CUDA context object by object takes
    seconds the study waits for, where the OS and the driver take it all back at once. Nothing is left to write."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _setup_problem(exc: Exception) -> tuple[str, str]:
    """(field, message) for a probe process that could not load its space's data or backend."""
    if isinstance(exc, UserError):
        return exc.field or "data", exc.detail
    if type(exc).__name__ == "BackendUnavailable":
        return "backend", str(exc)
    return "probe", f"{type(exc).__name__}: {_describe(exc)}"


def _describe(exc: Exception) -> str:
    text = str(exc).strip() or "(no message)"
    where = traceback.extract_tb(exc.__traceback__)
    if where:
        last = where[-1]
        text += f" [at {os.path.basename(last.filename)}:{last.lineno} in {last.name}]"
    return text[:2000]
