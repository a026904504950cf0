"""Child processes that do not outlive their parent, and stopping a child's whole process group.

Every long-lived child precsearch starts (probe workers, torchrun, MLflow servers) is started in a
session of its own (``start_new_session=True``), so that stopping it can stop everything it
started, and asks Linux to signal it when its parent dies, even by SIGKILL (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal Linux sends this process when its parent dies."""

#: Run a Python module in a child that Linux sends SIGTERM when its parent dies, even by SIGKILL. Set in
#: the child itself rather than in a ``preexec_fn``, which is unsafe when the parent runs threads.
_DYING_WITH_PARENT = ("import ctypes, runpy, signal, sys; "
                      f"sys.platform.startswith('linux') and ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, "
                      "signal.SIGTERM); "
                      "sys.argv[0] = {argv0!r}; runpy.run_module({module!r}, run_name='__main__'{alter})")


def dying_with_parent(cmd: list[str], argv0: str | None = None) -> list[str]:
    """``[python, -m, module, *args]`` rewritten so the child stops (SIGTERM) when this process dies.

    Args:
        cmd: The command, ``[python, "-m", module, *args]``.
        argv0: ``sys.argv[0]`` the module sees (e.g. ``"torchrun"`` for ``torch.distributed.run``); by
            default runpy sets it to the module's file, as ``python -m`` does.
    """
    if len(cmd) < 3 or cmd[1] != "-m":
        raise ValueError(f"expected [python, -m, module, ...], got {cmd[:3]}")
    alter = "" if argv0 is not None else ", alter_sys=True"
    code = _DYING_WITH_PARENT.format(module=cmd[2], argv0=argv0 or cmd[2], alter=alter)
    return [cmd[0], "-c", code, *cmd[3:]]


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def dump_stacks_on_signal(signum: int = signal.SIGUSR1) -> None:
    """On ``signum`` (``kill -USR1 PID``), print every thread's Python stack to stderr and go on running.

    Set in each precsearch process (the CLI, its workers, the probe process), so that a run that looks
    stuck says where it waits; the tests send it to a run that outlives its timeout before failing.
    """
    _with_stderr(lambda stream: faulthandler.register(signum, file=stream, all_threads=True, chain=False))


_exit_armed: list[float] = []


def wait_unless(stopping, seconds: float, poll_s: float = 0.05) -> None:
    """Sleep ``seconds``, ending within ``poll_s`` once ``stopping()`` answers True (a Ctrl-C only sets a flag:
    a worker sleeping its 2 s out made a stopped run take 2.2 s)."""
    end = time.monotonic() + seconds
    while not stopping() and (left := end - time.monotonic()) > 0:
        time.sleep(min(poll_s, left))


def exit_now(code: int) -> None:
    """End this process with ``code`` after its ``atexit`` handlers, log handlers and standard streams, without
    the interpreter's teardown of its modules (torch's, MLflow's: 0.2 s of a stopped run's 1.2 s on a busy 2-core
    machine, in the driver and again in each worker). For a process whose work is closed and said."""
    import atexit
    import logging

    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


_quick_exit: list[bool] = []


def quick_exit() -> None:
    """Skip the garbage collections of the interpreter's shutdown, from now on in this process (idempotent).

    A process that imported torch, MLflow and matplotlib spent 1.7 s after its last line freeing them
    (on a busy 2-core machine; 0.4 s with the collections skipped), once in the driver and once in each
    worker after a Ctrl-C. ``gc.freeze`` at exit leaves what a collection would free to the OS; every
    ``atexit`` handler and the flush of standard streams still run.
    """
    if not _quick_exit:
        import atexit
        import gc

        _quick_exit.append(True)
        atexit.register(lambda: (gc.disable(), gc.freeze()))


def exit_after(seconds: float) -> None:
    """End this process in ``seconds`` unless it has ended by then, printing every thread's stack first
    (``Timeout (h:mm:ss)!`` and the stacks on stderr, then exit status 1). Armed once: later calls keep the
    first deadline.

    faulthandler's watchdog is a C thread: it fires while the interpreter is stuck anywhere, and arming it
    takes no Python lock (a ``threading.Timer`` started from a signal handler could wait on a lock the
    interrupted main thread holds).
    """
    if not _exit_armed:
        _exit_armed.append(seconds)
        _with_stderr(lambda stream: faulthandler.dump_traceback_later(seconds, exit=True, file=stream))


def _with_stderr(arm) -> None:
    """Call ``arm(stream)`` with the first of stderr and the process's original stderr that has a file
    descriptor (tests capture ``sys.stderr``)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            arm(stream)
            return
        except (AttributeError, ValueError, OSError):
            continue


def dump_stacks(pid: int, settle_s: float = 3.0) -> list[str]:
    """Ask ``pid`` and its descendants that catch SIGUSR1 (precsearch's: see :func:`dump_stacks_on_signal`)
    to print their stacks; return a line per process of the tree (pid, status, command).

    The others (an MLflow server) are listed, not signalled: SIGUSR1 would end them.
    """
    import time

    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    lines = []
    for proc in procs:
        try:
            cmd = " ".join(proc.cmdline())
            lines.append(f"{proc.pid} {proc.status()} {cmd[:200]}")
            if _catches(proc.pid, signal.SIGUSR1):
                proc.send_signal(signal.SIGUSR1)
        except psutil.Error:
            continue
    time.sleep(settle_s)
    return lines


def _catches(pid: int, signum: int) -> bool:
    """True when ``pid`` has a handler for ``signum`` (the ``SigCgt`` mask of ``/proc/PID/status``)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL what is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if not group_alive(proc.pid):
            return


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` lives."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
