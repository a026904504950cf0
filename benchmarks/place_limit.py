"""Place a fixed-state reading's limit on the cases the soak's truth decided (issue 53: band limits placed on the
judge's decided cases and stated with them).

Reads the JSON of ``benchmarks/bench_judge_soak.py`` (every soak combination read at the states of one BF16
run, each with the soak's verdict: benign, damaging, non-finite or undecided) and, for one measure at one state,
finds the limits that call every decided-benign case ``stable`` and no decided-damaging case ``stable``, with the
band rule of :mod:`precsearch.instability` (stable: value + 2 SE at most (1 - margin) x limit):

* lowest: the largest benign upper end (value + 2 SE) over (1 - margin);
* highest: the smallest damaging value (a damaging case whose value is above the limit reads at least "near the
  limit"; one whose lower end is above it reads "unstable").

It picks the round number (1, 2 or 5 times a power of ten) in that range, or the range's geometric middle to two
digits where none is. A case the soak found non-finite is listed apart: the reading applies a policy's storage to
the BF16 run's state once, so a failure that grows in the policy's own run (the pre-fix ``fp8_block`` NaN) is not
in any state it reads, whatever the limit (docs/results/stability-judge.md).

    python benchmarks/place_limit.py --judge benchmarks/results/2026-12-06_h100_bench_judge_soak.json

prints the table and writes ``benchmarks/results/<date>_place_limit.json`` (``--json`` to move it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
INTERVAL_SE = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--judge", type=Path, required=True, help="bench_judge_soak.py's JSON")
    ap.add_argument("--truth", type=Path, default=None, help="a newer bench_soak.py report JSON whose verdicts "
                    "replace the truth the judge ran with (the readings do not depend on it)")
    ap.add_argument("--measure", default=None, help="the figure to place (default: the judge's main measure)")
    ap.add_argument("--state", default=None, help="the state's label in the JSON (default: its first, the probe's)")
    ap.add_argument("--margin", type=float, default=0.1, help="the stable band's share of the limit kept clear "
                    "(precsearch.instability.MARGIN)")
    ap.add_argument("--json", type=Path, default=None)
    return ap.parse_args(argv)


def with_truth(judge: dict[str, Any], soak: dict[str, Any], source: str) -> dict[str, Any]:
    """``judge`` with its truth taken from ``soak`` (``bench_soak.py``'s report: each combination's verdict at the
    detection limit and at the tolerance), as the judge records it."""
    cases = {name: {"at_limit": row.get("at_detection_limit"), "at_tolerance": row.get("at_tolerance"),
                    "gap_pct": row.get("gap_pct"), "se_pct": row.get("se_pct"), "runs": row.get("runs")}
             for name, row in soak["rows"].items()}
    truth = {"source": source, "detection_limit_pct": soak["detection_limit_pct"],
             "tolerance_pct": soak["tolerance_pct"], "date": soak.get("date"), "device": soak.get("device"),
             "cases": cases}
    return {**judge, "truth": truth}


def verdict_of(judge: dict[str, Any], case: str) -> str:
    """The soak's verdict at its detection limit for ``case``: benign, damaging, non-finite or undecided (a
    planted case or one the soak did not run: ``no truth``)."""
    meta = judge["cases"].get(case, {})
    if meta.get("pre_fix"):
        return "non-finite"
    truth = judge["truth"]["cases"].get(meta.get("truth") or "")
    if not truth:
        return "no truth"
    return truth.get("at_limit") or "undecided"


def figure(judge: dict[str, Any], case: str, state: str, measure: str) -> tuple[float, float] | None:
    """``case``'s (value, SE) of ``measure`` at ``state``, or None where it was not read."""
    at = (judge["readings"].get(case) or {}).get(state)
    if not isinstance(at, dict):
        return None
    main = at.get("main") if measure == judge["meta"]["measure"] else None
    fig = main or (at.get("figures") or {}).get(measure)
    if not fig or not all(isinstance(fig.get(k), (int, float)) for k in ("value", "se")):
        return None
    return float(fig["value"]), float(fig["se"])


def round_within(low: float, high: float) -> float:
    """The smallest 1-2-5 number in [low, high], else the geometric middle to two significant digits."""
    exponent = math.floor(math.log10(low))
    for e in range(exponent, exponent + 3):
        for m in (1, 2, 5):
            x = float(f"{m}e{e}")
            if low <= x <= high:
                return x
    return float(f"{math.sqrt(low * high):.2g}")


def place(judge: dict[str, Any], measure: str, state: str, margin: float) -> dict[str, Any]:
    """The decided cases at ``state`` and the limits that separate them (see the module docstring)."""
    rows = []
    for case in judge["readings"]:
        verdict = verdict_of(judge, case)
        fig = figure(judge, case, state, measure)
        if fig is None or verdict not in ("benign", "damaging", "non-finite"):
            continue
        value, se = fig
        rows.append({"case": case, "truth": verdict, "value": value, "se": se,
                     "low": value - INTERVAL_SE * se, "high": value + INTERVAL_SE * se})
    benign = [r for r in rows if r["truth"] == "benign"]
    damaging = [r for r in rows if r["truth"] == "damaging"]
    lowest = max((r["high"] for r in benign), default=0.0) / (1 - margin)
    highest = min((r["value"] for r in damaging), default=math.inf)
    separable = bool(benign) and bool(damaging) and lowest <= highest
    limit = round_within(lowest, highest) if separable else None
    for r in rows:
        r["band"] = band(r, limit, margin) if limit is not None else None
    return {"measure": measure, "state": state, "margin": margin, "lowest": lowest, "highest": highest,
            "separable": separable, "limit": limit, "cases": rows}


def band(row: dict[str, Any], limit: float, margin: float) -> str:
    """The band :mod:`precsearch.instability` gives, written out again here so the placement does not lean on it."""
    if row["high"] <= (1 - margin) * limit:
        return "stable"
    return "unstable" if row["low"] > limit else "near the limit"


def report(placed: dict[str, Any], judge: dict[str, Any]) -> str:
    meta = judge["meta"]
    lines = [f"{placed['measure']} at {placed['state']}: the soak judge of {meta.get('date')} on "
             f"{meta.get('device')} (truth {judge['truth'].get('source')}, detection limit "
             f"{judge['truth'].get('detection_limit_pct'):.2f}%)",
             "| case | soak's verdict | value | SE | value + 2 SE | band at the placed limit |",
             "|---|---|---|---|---|---|"]
    for r in sorted(placed["cases"], key=lambda r: r["value"]):
        lines.append(f"| {r['case']} | {r['truth']} | {r['value']:.3g} | {r['se']:.2g} | {r['high']:.3g} | "
                     f"{r['band'] or '-'} |")
    if placed["separable"]:
        lines.append(f"limits from {placed['lowest']:.3g} (every benign case stable) to {placed['highest']:.3g} (no "
                     f"damaging case stable): placed at {placed['limit']:g}")
    else:
        lines.append(f"no limit separates them: the benign cases need at least {placed['lowest']:.3g}, a damaging "
                     f"case reads {placed['highest']:.3g}")
    blind = [r["case"] for r in placed["cases"] if r["truth"] == "non-finite"]
    if blind:
        lines.append(f"not placeable (non-finite in their own runs, read from the BF16 run's state): {', '.join(blind)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    judge = json.loads(args.judge.read_text())
    if args.truth is not None:
        judge = with_truth(judge, json.loads(args.truth.read_text()), str(args.truth))
    measure = args.measure or judge["meta"]["measure"]
    state = args.state or next(iter(judge["states"]))
    if state not in judge["states"]:
        print(f"--state {state!r} is not a state of {args.judge}; valid: {list(judge['states'])}", file=sys.stderr)
        return 2
    placed = place(judge, measure, state, args.margin)
    print(report(placed, judge))
    out = args.json or RESULTS / f"{datetime.date.today()}_place_limit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"judge": str(args.judge), "truth": judge["truth"]["source"], **placed}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
