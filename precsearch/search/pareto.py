"""The Pareto front of finished, feasible trials."""

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
