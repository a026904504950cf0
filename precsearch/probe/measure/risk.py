"""A risk score in [0, 1) from a policy's early-warning signals, against its paired BF16 reference.

Each signal counts only by how much it exceeds the same signal of the BF16 reference run (same model,
data, seeds and length): what BF16 also does is training, not FP8 risk. The excess is measured in a
*unit*, the excess that on its own should count as a clear warning::

    e_i  = max(0, policy_i - reference_i - 2 s_i) / unit_i                 (rates, bounded values)
    e_i  = max(0, policy_i - reference_i - 2 s_i) / (unit_i * max(|reference_i|, floor_i))   (levels)

where ``s_i`` is the spread of the signal over the BF16 reference seeds (:func:`seed_spread`; 0 with
one seed): like the loss gap against the noise floor, a signal that moves as much between BF16 seeds
as between FP8 and BF16 is no warning. (On the H200, without it, every uniform FP8 recipe scored ~1.0
at 40 steps on grad-norm trends that differ between BF16 seeds too.)
    risk = 1 - exp(-sum_i e_i)

Why this form: it is 0 exactly when no signal exceeds BF16, rises strictly with each excess, and stays
below 1. It is a noisy-OR of per-signal risks ``1 - exp(-e_i)``: independent warnings add up, one very
strong warning alone saturates it, and no signal can cancel another (a policy that is calmer than BF16 on
one signal gets no credit on the others). ``risk >= 0.5`` (:data:`THRESHOLD`; ``sum e_i >= ln 2``: one
signal 0.69 units above BF16, or several smaller) flags a policy as risky.

The units (:data:`TERMS`) are priors, not fits: doubling of the block-output kurtosis or of the max
attention logit relative to BF16; 0.25 in ln units per 100 steps of extra amax or grad-norm growth (x1.28
per 100 steps, x7 over 800); 0.1 of extra mean gate/up ``|cos|`` (random rows sit near
``sqrt(2 / (pi * dim))``, 0.02 at dim 2048). ``benchmarks/bench_fidelity.py`` is the place to calibrate them
against long runs. A signal missing from either run contributes nothing and is listed in
:attr:`Risk.missing`, so a score from fewer signals is visible as such.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from precsearch.probe.measure.signals import Signals

THRESHOLD = 0.5
"""Risk at or above this flags a policy."""

SEED_SPREADS = 2.0
"""A signal counts only beyond this many BF16 seed spreads above the reference (when the spread is known)."""


@dataclass(frozen=True)
class Term:
    """How one signal enters the score.

    Attributes:
        signal: The :class:`~precsearch.probe.measure.signals.Signals` field.
        unit: The excess over BF16 that counts as one unit.
        relative: Excess relative to ``max(|reference|, floor)`` (levels) rather than absolute (rates).
        floor: Smallest reference magnitude a relative excess is taken against.
    """

    signal: str
    unit: float
    relative: bool = False
    floor: float = 1.0

    def excess(self, policy: float, reference: float, spread: float = 0.0) -> float:
        """Units by which ``policy`` exceeds ``reference`` by more than :data:`SEED_SPREADS` x ``spread``
        (the BF16 seeds' own spread of this signal; 0 when unknown), 0 when it does not."""
        over = max(0.0, policy - reference - SEED_SPREADS * spread)
        if self.relative:
            over /= max(abs(reference), self.floor)
        return over / self.unit


TERMS: tuple[Term, ...] = (
    Term("amax_growth", unit=0.25),
    Term("kurtosis", unit=1.0, relative=True),
    Term("alignment", unit=0.1),
    Term("attention_logit", unit=1.0, relative=True),
    Term("grad_norm_trend", unit=0.25),
)
"""The signals the score reads; see the module docstring for the units."""


@dataclass(frozen=True)
class Risk:
    """A risk score and what it is made of.

    Attributes:
        score: ``1 - exp(-sum of excesses)``, in [0, 1).
        excess: Per signal, its excess over BF16 in units (missing signals absent).
        missing: Signals that were NaN in the policy or the reference run.
    """

    score: float
    excess: dict[str, float]
    missing: tuple[str, ...]

    @property
    def risky(self) -> bool:
        """Whether the score reaches :data:`THRESHOLD`."""
        return self.score >= THRESHOLD


def seed_spread(seeds: Sequence[Signals], terms: tuple[Term, ...] = TERMS) -> dict[str, float]:
    """Per signal, the sample standard deviation over BF16 reference runs of different seeds (0 with
    fewer than two measured): how much a signal moves with the initial weights alone."""
    spread = {}
    for term in terms:
        values = [v for s in seeds if not math.isnan(v := getattr(s, term.signal))]
        spread[term.signal] = statistics.stdev(values) if len(values) >= 2 else 0.0
    return spread


def risk_score(policy: Signals, reference: Signals, terms: tuple[Term, ...] = TERMS,
               spread: dict[str, float] | None = None) -> Risk:
    """The policy's risk against its BF16 reference (module docstring); ``spread`` from :func:`seed_spread`."""
    excess, missing = {}, []
    for term in terms:
        p, r = getattr(policy, term.signal), getattr(reference, term.signal)
        if math.isnan(p) or math.isnan(r):
            missing.append(term.signal)
        else:
            excess[term.signal] = term.excess(p, r, (spread or {}).get(term.signal, 0.0))
    return Risk(score=1.0 - math.exp(-sum(excess.values())), excess=excess, missing=tuple(missing))
