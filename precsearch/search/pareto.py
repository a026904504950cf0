"""The Pareto front of finished, feasible trials.

Why not Optuna's ``study.best_trials``: it is not the same set here. It ranks every COMPLETE
trial, while precsearch's front (:func:`precsearch.search.front.trial_rows`) is taken over one row
per policy: a policy promoted to a longer rung is judged by its highest rung only (its shorter
trials are superseded, not dominated), and a duplicate told its twin's values is not a second
point (``best_trials`` would list both twins). Promotion (:mod:`precsearch.search.promotion`)
needs the front of arbitrary points, not of a study, too. Optuna's own non-domination helpers are private (``optuna.study._multi_objective``),
so the two small functions below are kept; ``tests/search/test_pareto_scoring.py`` pins them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# INTERVAL_SE: the standard errors on each side of a reading that make its interval (about 95%); one value for
# the front and for the interval and band every output prints (precsearch.instability)
from precsearch.instability import INTERVAL_SE


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str],
              a_spread: Sequence[float] | None = None, b_spread: Sequence[float] | None = None) -> bool:
    """True if ``a`` is at least as good as ``b`` everywhere and strictly better somewhere.

    With spreads (each value's interval half-width, 0 or NaN for an exact value), two values whose intervals
    overlap are equal on that objective: ``a`` is better or worse there only when the intervals are apart.
    """
    better = False
    for i, d in enumerate(directions):
        side = _side(a, b, a_spread, b_spread, i) * (-1 if d == "minimize" else 1)
        if side < 0:
            return False
        better = better or side > 0
    return better


def equal(a: Sequence[float], b: Sequence[float], a_spread: Sequence[float] | None = None,
          b_spread: Sequence[float] | None = None) -> bool:
    """True if ``a`` and ``b`` are one point within their intervals: on every objective neither is better or
    worse beyond them, as :func:`dominates` compares (an exact value, one without a spread, only its equal)."""
    return all(_side(a, b, a_spread, b_spread, i) == 0 for i in range(len(a)))


def _side(a: Sequence[float], b: Sequence[float], a_spread: Sequence[float] | None,
          b_spread: Sequence[float] | None, i: int) -> int:
    """1 where ``a[i]`` lies above ``b[i]`` beyond both intervals, -1 below, 0 where the intervals overlap."""
    x, y, hx, hy = a[i], b[i], _spread(a_spread, i), _spread(b_spread, i)
    return 1 if x - hx > y + hy else -1 if x + hx < y - hy else 0


def _spread(spread: Sequence[float] | None, i: int) -> float:
    value = 0.0 if spread is None else spread[i]
    return 0.0 if math.isnan(value) else value


def _spreads_of(spreads: Sequence[Sequence[float]] | None):
    """Point index -> its spreads, or None for every point when there are none."""
    return (lambda k: spreads[k]) if spreads is not None else (lambda k: None)


def distinct(indices: Sequence[int], points: Sequence[Sequence[float]],
             spreads: Sequence[Sequence[float]] | None = None) -> dict[int, int | None]:
    """Each of ``indices`` (front points, in the order to keep them) -> None where it is kept, else the index
    of the earlier kept point it equals (:func:`equal`): one point of each set that no interval separates."""
    spread = _spreads_of(spreads)
    kept: list[int] = []
    twin: dict[int, int | None] = {}
    for i in indices:
        twin[i] = next((k for k in kept if equal(points[i], points[k], spread(i), spread(k))), None)
        if twin[i] is None:
            kept.append(i)
    return twin


def pareto_indices(points: Sequence[Sequence[float]], directions: Sequence[str],
                   spreads: Sequence[Sequence[float]] | None = None) -> list[int]:
    """Indices of the points no other point dominates (duplicates all kept); ``spreads`` as :func:`dominates`."""
    spread = _spreads_of(spreads)
    return [
        i for i, p in enumerate(points)
        if not any(dominates(q, p, directions, spread(j), spread(i)) for j, q in enumerate(points) if j != i)
    ]
