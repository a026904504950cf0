"""Checks on command-line values: each refusal names its flag (the CLI exits 2 with one line)."""

from __future__ import annotations

import math
import os

from precsearch.errors import UserError


def at_least(flag: str, value: int | None, low: int, what: str) -> None:
    """Refuse ``value`` below ``low`` (None means the flag was not given)."""
    if value is not None and value < low:
        raise UserError(f"{flag} {value}: {what}; valid: {low} or more", field=flag)


def at_most(flag: str, value: int | None, high: int, what: str) -> None:
    """Refuse ``value`` above ``high`` (None means the flag was not given)."""
    if value is not None and value > high:
        raise UserError(f"{flag} {value}: {what}; valid: at most {high}", field=flag)


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: Probe processes allowed per CPU core: a worker also waits on its stores and logs, so a little
#: oversubscription still helps (the parallel tests run 3 workers on 2 cores); beyond it they only contend.
PROCESSES_PER_CPU = 2


def check_workers(workers: int, gpus_given: bool, nproc: int) -> None:
    """``--workers``: at least 1, not with ``--gpus``, and at most two probe processes per CPU core."""
    at_least("--workers", workers, 1, "the number of worker processes")
    if gpus_given and workers != 1:
        raise UserError("--workers and --gpus both choose how many workers run; with --gpus there is one "
                        "worker per GPU (per probe.nproc GPUs): leave out --workers", field="--workers")
    cpus = usable_cpus()
    if workers * nproc > PROCESSES_PER_CPU * cpus:
        most = max(1, PROCESSES_PER_CPU * cpus // nproc)
        raise UserError(f"--workers {workers} would run {workers * nproc} probe processes on {cpus} CPU cores, "
                        f"each far slower than alone; valid: 1 to {most}", field="--workers")


def check_gpus_present(text: str | None) -> None:
    """``--gpus`` on a machine without CUDA would silently run the probes on the CPU: refuse it."""
    if text is None:
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"--gpus {text}: no CUDA GPU is visible on this machine; on the CPU use --workers N",
                        field="--gpus")
    count = torch.cuda.device_count()
    listed = [int(g) for g in text.split(",") if g.strip().isdigit()]
    past = [g for g in listed if g >= count]
    if past:
        raise UserError(f"--gpus {text}: GPU {past[0]} does not exist; visible: 0 to {count - 1}", field="--gpus")


def check_fraction(flag: str, value: float | None) -> None:
    """A non-negative finite number (an instability threshold)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise UserError(f"{flag} {value}: give a finite number >= 0, e.g. 0.01", field=flag)
