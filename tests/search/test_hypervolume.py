"""Hypervolume on fronts whose areas and volumes are worked out by hand."""

from __future__ import annotations

import itertools
import random

import pytest

from precsearch.search.hypervolume import hypervolume

MIN2 = ("minimize", "minimize")
MIN3 = ("minimize", "minimize", "minimize")


def test_empty_front_is_zero():
    assert hypervolume([], MIN2, (1.0, 1.0)) == 0.0
    assert hypervolume([], MIN3, (1.0, 1.0, 1.0)) == 0.0


def test_single_point_is_its_box():
    assert hypervolume([(1.0, 2.0)], MIN2, (4.0, 5.0)) == pytest.approx(3 * 3)
    assert hypervolume([(1.0, 2.0, 3.0)], MIN3, (2.0, 4.0, 7.0)) == pytest.approx(1 * 2 * 4)


def test_staircase_2d():
    # ref (4, 4); points (1,3), (2,2), (3,1): a staircase of 3 + 2 + 1 unit strips = 6
    assert hypervolume([(1, 3), (2, 2), (3, 1)], MIN2, (4, 4)) == pytest.approx(6.0)


def test_order_does_not_matter():
    pts = [(1, 3), (2, 2), (3, 1)]
    assert hypervolume(pts[::-1], MIN2, (4, 4)) == pytest.approx(6.0)


def test_dominated_and_duplicate_points_add_nothing():
    front = [(1, 3), (2, 2), (3, 1)]
    extra = [(2, 3), (3, 3), (3.5, 1.5), (2, 2)]  # each dominated by (or equal to) a front point
    assert hypervolume(front + extra, MIN2, (4, 4)) == pytest.approx(6.0)
    front3 = [(1, 2, 2), (2, 1, 2)]
    assert hypervolume(front3 + [(2, 2, 2), (1.5, 2, 3)], MIN3, (3, 3, 3)) == \
        pytest.approx(hypervolume(front3, MIN3, (3, 3, 3)))


def test_points_not_better_than_reference_add_nothing():
    # (5, 1) is beyond the reference in x; (1, 4) sits on it in y: both add no area
    assert hypervolume([(2, 2), (5, 1), (1, 4)], MIN2, (4, 4)) == pytest.approx(4.0)


def test_directions_maximize_memory_minimize_instability():
    # the benchmark's case: maximize memory saved, minimize instability; ref (0 saved, limit 0.01)
    directions = ("maximize", "minimize")
    pts = [(0.2, 0.004), (0.1, 0.0)]
    # (0.2, 0.004): box 0.2 x 0.006 = 0.0012; (0.1, 0.0) adds 0.1 x 0.004 = 0.0004 below it
    assert hypervolume(pts, directions, (0.0, 0.01)) == pytest.approx(0.0016)
    # the same front mirrored into minimize/minimize gives the same area
    assert hypervolume([(-m, i) for m, i in pts], MIN2, (0.0, 0.01)) == pytest.approx(0.0016)


def test_all_maximize():
    assert hypervolume([(3, 1), (1, 3)], ("maximize", "maximize"), (0, 0)) == pytest.approx(3 + 3 - 1)


def test_two_boxes_3d_inclusion_exclusion():
    # boxes [1,3]x[2,3]x[2,3] (2) and [2,3]x[1,3]x[2,3] (2) overlap in [2,3]x[2,3]x[2,3] (1): 3
    assert hypervolume([(1, 2, 2), (2, 1, 2)], MIN3, (3, 3, 3)) == pytest.approx(3.0)


def test_3d_staircase():
    # three points on the plane x + y + z = 3 inside ref (2, 2, 2): each box is 1 x 1 x 2 = 2...
    pts = [(0, 1, 1), (1, 0, 1), (1, 1, 0)]
    # union of [0,2]x[1,2]x[1,2], [1,2]x[0,2]x[1,2], [1,2]x[1,2]x[0,2]: 2 + 2 + 2 - 3 x 1 + 1 = 4
    assert hypervolume(pts, MIN3, (2, 2, 2)) == pytest.approx(4.0)


def test_3d_with_mixed_directions():
    pts = [(0, 1, 1), (1, 0, 1), (1, 1, 0)]
    flipped = [(-x, y, -z) for x, y, z in pts]
    assert hypervolume(flipped, ("maximize", "minimize", "maximize"), (-2, 2, -2)) == pytest.approx(4.0)


def test_3d_matches_grid_count():
    """Against counting unit cells of an integer grid, on random integer fronts."""
    rng = random.Random(0)
    for _ in range(20):
        pts = [tuple(rng.randint(0, 5) for _ in range(3)) for _ in range(rng.randint(1, 8))]
        cells = sum(
            1 for c in itertools.product(range(6), repeat=3)
            if any(all(p[k] <= c[k] for k in range(3)) for p in pts)
        )
        assert hypervolume(pts, MIN3, (6, 6, 6)) == pytest.approx(cells)


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        hypervolume([(1,)], ("minimize",), (2,))
    with pytest.raises(ValueError):
        hypervolume([(1, 2)], ("minimize", "upward"), (3, 3))
    with pytest.raises(ValueError):
        hypervolume([(1, 2, 3)], MIN2, (3, 3))
