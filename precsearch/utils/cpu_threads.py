"""How many threads a CPU probe uses: the cores actually free, not every core the machine has.

PyTorch starts one OpenMP thread per core. On a machine other jobs keep busy, the threads of one
GEMM wait for each other at every barrier, each behind another job's time slice: the README's
quickstart took 33 min 54 s on a busy 2-core machine (load ~4) and 3 min 45 s with
``OMP_NUM_THREADS=1``. A probe process therefore takes the cores its affinity allows less those
other jobs keep busy, at least one, shared among the probe processes of this run.

What is busy is measured, not guessed from the load average: over a short sample the kernel's
per-CPU time counters (``/proc/stat``) say how much of the probe's cores was used, and the
process tree of this run (the study process, its probe process and MLflow server) is taken out.
The 1-minute load average counted the run's own start-up and whatever the user ran the minute
before: on an idle 2-core machine a study's probe started at a load of about 1 and so trained
its whole run on one thread, at half the speed of two (SmolLM2's 30 blocks, 2026-12-07). Where
``/proc`` is not there (not Linux), the load average is the fallback.

A user's ``OMP_NUM_THREADS`` (or ``PRECSEARCH_CPU_THREADS``) always wins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

THREADS_ENV = "PRECSEARCH_CPU_THREADS"
#: How long the busy cores are sampled for (the kernel counts in 10 ms ticks: 60 ticks on 2 cores).
SAMPLE_S = 0.3


def affinity() -> set[int] | None:
    """The CPUs this process may run on; None where the OS does not say (not Linux)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return None


def usable_cores() -> int:
    """Cores this process may run on (its affinity, not the machine's count)."""
    cpus = affinity()
    return len(cpus) if cpus is not None else os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def cpu_ticks(stat: str, cpus: set[int] | None = None) -> tuple[int, int]:
    """(busy, all) clock ticks of ``cpus`` (every CPU when None) in the text of ``/proc/stat``.

    Idle is the ``idle`` and ``iowait`` columns; busy is the rest of the first eight (user, nice, system, irq,
    softirq, steal; the guest columns are inside user already).
    """
    busy = total = 0
    for line in stat.splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks = [int(v) for v in values[:8]]
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def process_ticks(stat: str) -> tuple[int, int, int]:
    """(pid, parent pid, user + system ticks) from the text of ``/proc/PID/stat`` (all the process's threads).

    The command name sits in parentheses and may hold spaces and parentheses itself: the fields are counted
    from the last ``)``.
    """
    head, _, rest = stat.rpartition(")")
    fields = rest.split()
    pid = int(head.split("(", 1)[0])
    return pid, int(fields[1]), int(fields[11]) + int(fields[12])


def tree_ticks(processes: list[tuple[int, int, int]], root: int) -> int:
    """Ticks of ``root`` and every process descended from it, among ``processes`` ((pid, ppid, ticks) each)."""
    children: dict[int, list[int]] = {}
    ticks = {}
    for pid, ppid, t in processes:
        children.setdefault(ppid, []).append(pid)
        ticks[pid] = t
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def _read_processes(proc: Path) -> list[tuple[int, int, int]]:
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found.append(process_ticks((entry / "stat").read_text()))
        except (OSError, ValueError, IndexError):  # it ended meanwhile, or a stat file unlike Linux's
            continue
    return found


def busy_elsewhere(root: int, sample_s: float = SAMPLE_S, cpus: set[int] | None = None,
                   proc: Path = Path("/proc"), sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Cores of ``cpus`` (default: this process's affinity) that processes outside ``root``'s tree kept busy
    over ``sample_s``; None where ``/proc`` cannot be read."""
    cpus = affinity() if cpus is None else cpus
    if cpus is None:
        return None

    def sample() -> tuple[int, int, int]:  # (busy, all) ticks of the CPUs, and the run's own ticks
        return *cpu_ticks((proc / "stat").read_text(), cpus), tree_ticks(_read_processes(proc), root)

    try:
        busy0, all0, ours0 = sample()
        sleep(sample_s)
        busy1, all1, ours1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if all1 <= all0:
        return None
    # the tree's ticks count on every CPU; on a machine wider than the affinity this takes out a little too much
    others = max(0, (busy1 - busy0) - (ours1 - ours0))
    return len(cpus) * others / (all1 - all0)


def free_threads(cores: int, load: float, processes: int = 1) -> int:
    """Threads per probe process: ``cores`` less the busy ones (``load``: the cores other jobs keep busy, or the
    load average; rounded), split over ``processes``.

    Rounded, not ceiled: 0.4 of a core busy on an idle machine (its own shell, a monitor) leaves every core.
    """
    free = cores - int(round(max(load, 0.0)))
    return max(1, min(cores, free) // max(1, processes))


def choose_threads(processes: int = 1, environ: dict[str, str] | None = None, root: int | None = None) -> int | None:
    """The thread count a CPU probe should set, or None when the user set one (``OMP_NUM_THREADS``).

    ``PRECSEARCH_CPU_THREADS`` (a positive integer) overrides the choice. ``root``: the process whose tree is
    this run (default: this process); what the rest of the machine keeps busy is measured
    (:func:`busy_elsewhere`), or read off the load average where it cannot be.
    """
    env = os.environ if environ is None else environ
    given = env.get(THREADS_ENV, "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    busy = busy_elsewhere(os.getpid() if root is None else root)
    return free_threads(usable_cores(), load_average() if busy is None else busy, processes)
