"""The risk score against the BF16 reference (:mod:`precsearch.probe.measure.risk`)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from precsearch.probe.measure.risk import TERMS, THRESHOLD, risk_score, seed_spread
from precsearch.probe.measure.signals import Signals

REFERENCE = Signals(amax_growth=0.1, kurtosis=4.0, alignment=0.05, attention_logit=8.0, grad_norm_trend=-0.2)


def test_policy_equal_to_reference_scores_zero():
    """What BF16 also does is not FP8 risk: the same signals must read exactly 0."""
    risk = risk_score(REFERENCE, REFERENCE)
    assert risk.score == 0.0 and not risk.risky and risk.missing == ()
    assert set(risk.excess) == {t.signal for t in TERMS}


@pytest.mark.parametrize("term", TERMS, ids=lambda t: t.signal)
def test_score_rises_with_each_signal_above_the_reference_and_only_above_it(term):
    """Monotone in every signal: a higher value never lowers the score, and above BF16 strictly raises it."""
    base = getattr(REFERENCE, term.signal)
    # far above BF16, 1 - exp(-e) rounds to 1.0 in floating point, so stay within a few units
    steps = [base - 1.0, base - 0.01, base, base + 0.02, base + 0.1, base + 0.3]
    scores = [risk_score(dataclasses.replace(REFERENCE, **{term.signal: v}), REFERENCE).score for v in steps]
    assert scores[:3] == [0.0, 0.0, 0.0]
    assert all(a < b for a, b in zip(scores[2:], scores[3:]))
    assert all(0.0 <= s < 1.0 for s in scores)


def test_one_unit_of_one_signal_reads_1_minus_1_over_e():
    """The documented formula: kurtosis doubling vs BF16 is one unit, risk = 1 - exp(-1)."""
    policy = dataclasses.replace(REFERENCE, kurtosis=8.0)
    risk = risk_score(policy, REFERENCE)
    assert risk.excess["kurtosis"] == pytest.approx(1.0)
    assert risk.score == pytest.approx(1 - math.exp(-1)) and risk.risky


def test_calm_signals_do_not_cancel_an_alarming_one():
    """A policy calmer than BF16 on four signals must score as if those matched BF16."""
    alarming = dataclasses.replace(REFERENCE, attention_logit=16.0)
    calm_elsewhere = dataclasses.replace(alarming, amax_growth=-1.0, kurtosis=3.0, alignment=0.0, grad_norm_trend=-2.0)
    assert risk_score(calm_elsewhere, REFERENCE).score == risk_score(alarming, REFERENCE).score


def test_threshold_is_ln2_units_in_total():
    """0.5 is reached by the sum of excesses reaching ln 2, however it is split."""
    just_below = dataclasses.replace(REFERENCE, amax_growth=0.1 + 0.25 * 0.34, grad_norm_trend=-0.2 + 0.25 * 0.34)
    just_above = dataclasses.replace(REFERENCE, amax_growth=0.1 + 0.25 * 0.35, grad_norm_trend=-0.2 + 0.25 * 0.35)
    assert risk_score(just_below, REFERENCE).score < THRESHOLD <= risk_score(just_above, REFERENCE).score


def test_relative_terms_use_a_floor_for_tiny_references():
    """A reference logit near 0 must not turn a modest policy logit into a huge ratio."""
    reference = dataclasses.replace(REFERENCE, attention_logit=0.001)
    policy = dataclasses.replace(reference, attention_logit=0.5)
    assert risk_score(policy, reference).excess["attention_logit"] == pytest.approx(0.499)


def test_missing_signals_are_listed_and_do_not_count():
    """A NaN in either run (signal not measured) contributes nothing, and the score says it is partial."""
    policy = dataclasses.replace(REFERENCE, alignment=math.nan, kurtosis=40.0)
    reference = dataclasses.replace(REFERENCE, attention_logit=math.nan)
    risk = risk_score(policy, reference)
    assert risk.missing == ("alignment", "attention_logit")
    assert set(risk.excess) == {"amax_growth", "kurtosis", "grad_norm_trend"}
    assert risk.score == pytest.approx(1 - math.exp(-9.0))


def test_a_signal_within_two_bf16_seed_spreads_is_no_warning():
    """If BF16 seeds differ among themselves as much as FP8 differs from BF16, that is not FP8's doing."""
    seeds = [Signals(grad_norm_trend=v) for v in (-7.0, -6.0, -8.0)]  # sample std 1.0
    spread = seed_spread(seeds)
    assert spread["grad_norm_trend"] == pytest.approx(1.0) and spread["kurtosis"] == 0.0  # unmeasured: 0
    reference = Signals(grad_norm_trend=-7.0)
    within = risk_score(Signals(grad_norm_trend=-5.5), reference, spread=spread)
    beyond = risk_score(Signals(grad_norm_trend=-4.5), reference, spread=spread)
    assert within.excess["grad_norm_trend"] == 0.0 and within.score == 0.0
    assert beyond.excess["grad_norm_trend"] == pytest.approx(0.5 / 0.25)  # 2.5 over, 2 spreads forgiven
    assert risk_score(Signals(grad_norm_trend=-5.5), reference).excess["grad_norm_trend"] == pytest.approx(6.0)
