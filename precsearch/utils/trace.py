"""An opt-in timeline of a study's processes: where the wall time goes, span by span.

With ``PRECSEARCH_TRACE=<file>`` set, every process of a run (the study, its
probe process, workers) appends one JSON line per finished span to that file:
``{"name", "pid", "role", "t0", "t1"}`` plus the span's own fields (a trial
number, a label), ``t0``/``t1`` in epoch seconds. Unset, :func:`span` costs one
dictionary lookup. ``benchmarks/bench_probe.py`` sets it and reads the file back
(:func:`read`) to say when the probe process, which holds the GPU, waited for
the study process and on what.

Lines are written with one ``write`` to a file opened for appending, so lines of
several processes do not interleave (POSIX appends of less than a pipe buffer).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENV = "PRECSEARCH_TRACE"
#: What this process is in the timeline ("study", "probe", ...): set once by the process's entry point.
_role = {"name": "study"}


def set_role(role: str) -> None:
    """Name this process in the timeline (the probe process calls it with "probe")."""
    _role["name"] = role


def enabled() -> bool:
    return bool(os.environ.get(ENV))


@contextmanager
def span(name: str, **fields: Any) -> Iterator[None]:
    """Time the block as span ``name`` (written when it ends, also when it raises)."""
    if not enabled():
        yield
        return
    t0 = time.time()
    try:
        yield
    finally:
        write(name, t0, time.time(), **fields)


def write(name: str, t0: float, t1: float, **fields: Any) -> None:
    """Append one span that ran from ``t0`` to ``t1`` (epoch seconds); nothing when tracing is off."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"name": name, "pid": os.getpid(), "role": _role["name"], "t0": t0, "t1": t1} | fields,
                      default=str)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    """The spans of a trace file, by start time (a line cut short by a killed process is skipped)."""
    spans = []
    for line in Path(path).read_text().splitlines():
        try:
            spans.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sorted(spans, key=lambda s: s["t0"])
