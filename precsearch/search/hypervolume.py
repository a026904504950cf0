"""Hypervolume of a front in 2 or 3 objectives, with directions and a reference point.

The hypervolume is the size of the region that the front's points dominate and
that the reference point bounds: the larger, the better the front. Each
objective is turned into a minimisation (a maximised one is negated), so a
point contributes only where it is strictly better than the reference point in
every objective; points that do not are ignored, and so are dominated points
(they add nothing to the union).

* 2 objectives: sort by the first objective and sweep, adding one rectangle per
  point that improves the second objective.
* 3 objectives: slice along the third objective; each slab's volume is the 2-D
  hypervolume of the points below it times the slab's thickness. This is
  O(n^2 log n), fine for the fronts of a few hundred points used here.
"""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, ...]


def hypervolume(points: Sequence[Sequence[float]], directions: Sequence[str],
                reference: Sequence[float]) -> float:
    """The hypervolume ``points`` dominate up to ``reference``.

    ``directions`` gives ``"maximize"`` or ``"minimize"`` per objective; there
    must be 2 or 3 objectives. An empty front (or one with no point better than
    ``reference`` everywhere) has hypervolume 0.
    """
    n = len(directions)
    if n not in (2, 3):
        raise ValueError(f"hypervolume supports 2 or 3 objectives, got {n}")
    if len(reference) != n:
        raise ValueError(f"reference point has {len(reference)} values for {n} objectives")
    ref = _as_minimized(reference, directions)
    inside = [p for p in (_as_minimized(q, directions) for q in points) if _strictly_better(p, ref)]
    if len(inside) == 0:
        return 0.0
    return _hv2(inside, ref) if n == 2 else _hv3(inside, ref)


def _as_minimized(point: Sequence[float], directions: Sequence[str]) -> Point:
    """The point with every maximised objective negated."""
    if len(point) != len(directions):
        raise ValueError(f"point {tuple(point)} has {len(point)} values for {len(directions)} objectives")
    out = []
    for value, direction in zip(point, directions):
        if direction not in ("maximize", "minimize"):
            raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
        out.append(-float(value) if direction == "maximize" else float(value))
    return tuple(out)


def _strictly_better(p: Point, ref: Point) -> bool:
    return all(x < r for x, r in zip(p, ref))


def _hv2(points: Sequence[Point], ref: Point) -> float:
    """2-D sweep over minimised points that all beat ``ref``."""
    area, best_y = 0.0, ref[1]
    for x, y in sorted((p[0], p[1]) for p in points):
        if y < best_y:  # a point that does not lower the best y so far is dominated
            area += (ref[0] - x) * (best_y - y)
            best_y = y
    return area


def _hv3(points: Sequence[Point], ref: Point) -> float:
    """3-D slicing along the last objective over minimised points that all beat ``ref``."""
    by_z = sorted(points, key=lambda p: p[2])
    volume = 0.0
    for i, p in enumerate(by_z):
        top = by_z[i + 1][2] if i + 1 < len(by_z) else ref[2]
        if top > p[2]:
            volume += _hv2(by_z[: i + 1], ref) * (top - p[2])
    return volume
