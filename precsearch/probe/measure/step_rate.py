"""Throughput from a probe's step times, with the standard error of that figure.

The probe's tokens/s is its tokens per step over the *median* step time (a stray slow step, a collection or an
allocation, moves a mean and not a median). Its standard error comes from the same steps: the median's standard
error for a normal sample is ``sqrt(pi / 2) * sigma / sqrt(n)``, with ``sigma`` estimated robustly as ``1.4826 *
MAD`` (the median absolute deviation), so the slow steps that the median ignores do not widen it either. Relative
to the median, that is the rate's relative standard error to first order.

What it covers: the step-to-step noise of this one run. What it does not: drift between runs (clocks,
temperature, where the allocator put things), which no study measures yet. Two trials whose intervals overlap
measured the same speed as far as their own steps can tell (docs/scoring.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: Fewer timed steps than this give no standard error (NaN): a MAD of three or four steps is mostly luck.
MIN_STEPS = 5
_MEDIAN_SE = math.sqrt(math.pi / 2)  # the median's standard error over the mean's, for a normal sample
_MAD_SIGMA = 1.4826  # sigma over the median absolute deviation, for a normal sample


def step_rate(step_times: Sequence[float], tokens_per_step: int) -> tuple[float, float]:
    """``(tokens per second, its relative standard error)`` over ``step_times`` (seconds per step).

    ``(0.0, nan)`` with no steps; the error is NaN with fewer than :data:`MIN_STEPS` steps, and 0 when every
    step took the same time (a clock that coarse has nothing more to say).
    """
    if not step_times:
        return 0.0, math.nan
    median = statistics.median(step_times)
    if median <= 0:
        raise ValueError(f"step times must be positive, got a median of {median}")
    rate = tokens_per_step / median
    if len(step_times) < MIN_STEPS:
        return rate, math.nan
    mad = statistics.median(abs(t - median) for t in step_times)
    return rate, _MEDIAN_SE * _MAD_SIGMA * mad / math.sqrt(len(step_times)) / median
