"""Where a study's wall time went, read from its trace (``PRECSEARCH_TRACE``, :mod:`precsearch.utils.trace`).

The probe process holds the GPU. Its time is either a request it serves (a
trial's probe, its fixed-state reading, a BF16 reference) or waiting. A wait is
charged to what the study process was doing then (its innermost span that is
not itself a wait on the probe process), or, before the first request, to the
probe process's own start-up; what no span covers is ``other``.

:func:`probe_time` returns seconds by part; they add up to the wall time given. From a shell::

    python -m precsearch.runtime.timeline trace.jsonl     # the table, from the first span's start to the last's end
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: The probe process's spans that are work (a request and its parts; the innermost names the time). The
#: reading's parts (:class:`precsearch.probe.damage.reader.DamageReader`): at the first trial of a clipping
#: value its BF16 side (the BF16 run to its states, then per state the BF16 gradients and their Gram
#: matrices), then at each state the policy's side (its model set to the state, its gradients and held-out
#: losses) and the compare (the figures; for states kept on the host, their copies in). Once per clipping value
#: the standard FP8 recipe is read the same way (:mod:`precsearch.runtime.standard`).
REQUEST = "probe request"
BF16_SIDE_PARTS = ("reading: BF16 run", "reading: BF16 gradients", "reading: BF16 grams")
REQUEST_PARTS = ("probe", "fixed-state reading", "standard FP8 reading", "reading: BF16 side", *BF16_SIDE_PARTS,
                 "reading: side", "reading: compare")
#: Study-process spans that only wait for the probe process: a wait inside them is charged to what else ran.
WAITS_ON_PROBE = ("trial probe", "references", "standard FP8 reading")
#: The probe process's own start-up spans (charged while no request has come yet).
PROBE_STARTUP = ("probe process: start", "probe process: set-up")


def probe_time(spans: list[dict[str, Any]], t0: float, t1: float) -> dict[str, float]:
    """Seconds of ``t0 .. t1`` by part: the requests' parts (``busy: probe``, ``busy: fixed-state reading``,
    ``busy: other``: the rest of a request, its result sent back) and the waits (``idle: <span name>``)."""
    requests = [s for s in spans if s["role"] == "probe" and s["name"] == REQUEST]
    parts = [s for s in spans if s["role"] == "probe" and s["name"] in REQUEST_PARTS]
    startup = [s for s in spans if s["role"] == "probe" and s["name"] in PROBE_STARTUP]
    study = [s for s in spans if s["role"] != "probe" and s["name"] not in WAITS_ON_PROBE]
    cuts = sorted({t0, t1, *(x for s in spans for x in (s["t0"], s["t1"]) if t0 < x < t1)})
    out: dict[str, float] = {}
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        if _covering(requests, mid):
            part = _covering(parts, mid)
            key = f"busy: {part[-1]['name']}" if part else "busy: other"
        elif (up := _covering(startup, mid)) and not any(r["t0"] < mid for r in requests):
            key = f"idle: {up[-1]['name']}"
        else:
            doing = _covering(study, mid)
            key = f"idle: {doing[-1]['name']}" if doing else "idle: other"
        out[key] = out.get(key, 0.0) + (b - a)
    return out


def _covering(spans: list[dict[str, Any]], t: float) -> list[dict[str, Any]]:
    """The spans running at ``t``, innermost (latest start) last."""
    return sorted((s for s in spans if s["t0"] <= t < s["t1"]), key=lambda s: s["t0"])


def format_table(parts: dict[str, float], wall: float) -> str:
    """``parts`` (of :func:`probe_time`) as lines: the busy total, then each part, busy ones first."""
    busy = sum(v for k, v in parts.items() if k.startswith("busy"))
    lines = [f"the probe process (it holds the GPU): busy {busy:.1f}s of {wall:.1f}s ({100 * busy / wall:.1f}%)"]
    for name, s in sorted(parts.items(), key=lambda kv: (not kv[0].startswith("busy"), -kv[1])):
        lines.append(f"  {name:44s} {s:8.2f}s {100 * s / wall:6.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from precsearch.utils import trace

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m precsearch.runtime.timeline TRACE_FILE", file=sys.stderr)
        return 2
    spans = trace.read(Path(args[0]))
    if not spans:
        print(f"{args[0]}: no spans", file=sys.stderr)
        return 1
    t0, t1 = spans[0]["t0"], max(s["t1"] for s in spans)
    print(format_table(probe_time(spans, t0, t1), t1 - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
