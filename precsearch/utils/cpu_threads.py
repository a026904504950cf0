"""How many threads a CPU probe uses: the cores actually free, not every core the machine has.

PyTorch starts one OpenMP thread per core. On a machine other jobs keep busy, the threads of one
GEMM wait for each other at every barrier, each behind another job's time slice: the README's
quickstart took 33 min 54 s on a busy 2-core machine (load ~4) and 3 min 45 s with
``OMP_NUM_THREADS=1``. A probe process therefore takes the cores its affinity allows less those
the load average says are busy, at least one, shared among the probe processes of this run.

A user's ``OMP_NUM_THREADS`` (or ``PRECSEARCH_CPU_THREADS``) always wins.
"""

from __future__ import annotations

import os

THREADS_ENV = "PRECSEARCH_CPU_THREADS"


def usable_cores() -> int:
    """Cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def free_threads(cores: int, load: float, processes: int = 1) -> int:
    """Threads per probe process: ``cores`` less the busy ones (``load``, rounded), split over ``processes``.

    Rounded, not ceiled: a load of 0.4 on an idle machine (its own shell, a monitor) leaves every core.
    """
    free = cores - int(round(max(load, 0.0)))
    return max(1, min(cores, free) // max(1, processes))


def choose_threads(processes: int = 1, environ: dict[str, str] | None = None) -> int | None:
    """The thread count a CPU probe should set, or None when the user set one (``OMP_NUM_THREADS``).

    ``PRECSEARCH_CPU_THREADS`` (a positive integer) overrides the choice.
    """
    env = os.environ if environ is None else environ
    given = env.get(THREADS_ENV, "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    return free_threads(usable_cores(), load_average(), processes)
