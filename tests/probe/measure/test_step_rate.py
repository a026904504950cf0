"""The probe's tokens/s and its standard error (``precsearch.probe.measure.step_rate``).

What would be wrong if these failed: the front would call two trials' speeds different on noise (an error too
small), or equal when they are not (too large), or one slow step would move a trial's speed.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from precsearch.probe.measure.step_rate import MIN_STEPS, step_rate


def test_the_rate_is_tokens_over_the_median_step_and_a_stray_slow_step_moves_neither_figure():
    steps = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01]
    rate, se = step_rate(steps, 4096)
    assert rate == pytest.approx(4096 / 1.00)
    slow_rate, slow_se = step_rate(steps + [5.0], 4096)  # a collection, an allocation
    assert slow_rate == pytest.approx(rate, rel=0.01) and slow_se == pytest.approx(se, rel=0.5)


def test_the_error_matches_the_spread_of_the_rate_over_repeated_runs():
    """The stated relative error of one run of 40 steps (1% step-time noise) against the measured spread of the
    rate over 3,000 such runs: within 10%."""
    rng = random.Random(0)
    rates, errors = [], []
    for _ in range(3000):
        rate, rel = step_rate([rng.gauss(1.0, 0.01) for _ in range(40)], 1000)
        rates.append(rate)
        errors.append(rel)
    measured = statistics.stdev(rates) / statistics.fmean(rates)
    assert statistics.fmean(errors) == pytest.approx(measured, rel=0.10)


def test_too_few_steps_give_no_error_and_no_steps_no_rate():
    assert math.isnan(step_rate([1.0] * (MIN_STEPS - 1), 10)[1])
    assert step_rate([1.0] * MIN_STEPS, 10) == (10.0, 0.0)  # a clock that saw no spread
    rate, se = step_rate([], 10)
    assert rate == 0.0 and math.isnan(se)
    with pytest.raises(ValueError, match="positive"):
        step_rate([0.0] * 6, 10)
