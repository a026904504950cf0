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

from collections.abc import Sequence


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str]) -> bool:
    """True if ``a`` is at least as good as ``b`` everywhere and strictly better somewhere."""
    better = False
    for x, y, d in zip(a, b, directions):
        if d == "minimize":
            x, y = -x, -y
        if x < y:
            return False
        better = better or x > y
    return better


def pareto_indices(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[int]:
    """Indices of the points no other point dominates (duplicates all kept)."""
    return [
        i for i, p in enumerate(points)
        if not any(dominates(q, p, directions) for j, q in enumerate(points) if j != i)
    ]
