"""The judge's statistics for ``bench_fidelity.py``: the truth with its standard error, each early reading's
rank correlation with it, its calls on the policies the truth decides, and the fixed-state damage readings.

The truth of a policy is its paired long-run gap: per init seed, the long run's held-out loss over its BF16
reference's (same seed, data, schedule) minus 1, averaged over the seeds, with the standard error of that
mean. It *decides* a policy only where that error allows: **damaging** when the policy diverged at any seed
or its gap's lower bound (mean - 2 SE) is above the tolerance, **benign** when its upper bound (mean + 2 SE)
is below it; otherwise undecided (the truth itself cannot call it at this many seeds).

A reading (a number per policy, larger is worse) is judged by its Spearman correlation with the truth over
all policies (a diverged one ranks worst) and over the target set of the issue (the planted graded series
and every decided policy), and by its calls (unstable when above its limit) on the decided
policies: false-stable (a damaging policy called stable: the costly error) and false-unstable.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Long-run gap a policy may cost and still be benign: DeepSeek-V3 reports its FP8 training's relative loss
#: error against BF16 "consistently below 0.25%" (DeepSeek-V3 technical report, section 3.3).
TOLERANCE = 0.0025


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank; +inf ranks last (a diverged policy is the worst)."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="mergesort")
    out = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        out[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho (Pearson's r of the ranks); NaN if either has no spread or any NaN."""
    if len(x) < 3 or any(math.isnan(v) for v in list(x) + list(y)):
        return math.nan
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def truth(gaps: list[float], diverged: bool, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """A policy's long-run truth from its per-seed paired gaps (see the module docstring)."""
    if diverged:
        return {"mean": math.inf, "se": math.nan, "seeds": len(gaps), "call": "damaging"}
    mean = float(np.mean(gaps))
    se = float(np.std(gaps, ddof=1) / math.sqrt(len(gaps))) if len(gaps) > 1 else math.nan
    call = "undecided"
    if math.isfinite(se) and mean - 2 * se > tolerance:
        call = "damaging"
    elif math.isfinite(se) and mean + 2 * se < tolerance:
        call = "benign"
    return {"mean": mean, "se": se, "seeds": len(gaps), "call": call}


def judge(names: list[str], truths: list[dict], values: list[float], limit: float,
          graded: list[bool] | None = None) -> dict[str, Any]:
    """One reading against the truth: Spearman over all policies and over the issue's target set (the planted
    graded series, ``graded``, with every policy the truth decides), and its calls (value > limit: unstable) on
    the decided policies."""
    rho = spearman(values, [t["mean"] for t in truths])
    calls = [v > limit for v in values]
    decided = [i for i, t in enumerate(truths) if t["call"] != "undecided"]
    target = sorted(set(decided) | {i for i, g in enumerate(graded or []) if g})
    rho_target = spearman([values[i] for i in target], [truths[i]["mean"] for i in target])
    false_stable = [names[i] for i in decided if truths[i]["call"] == "damaging" and not calls[i]]
    false_unstable = [names[i] for i in decided if truths[i]["call"] == "benign" and calls[i]]
    right = len(decided) - len(false_stable) - len(false_unstable)
    return {"spearman": rho, "spearman_target": rho_target, "target": [names[i] for i in target],
            "limit": limit, "decided": len(decided), "right": right,
            "false_stable": false_stable, "false_unstable": false_unstable}
