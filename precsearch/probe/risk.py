"""A risk score in [0, 1) from a policy's early-warning signals, against its paired BF16 reference.

Each signal counts only by how much it exceeds the same signal of the BF16 reference run (same model,
data, seeds and length): what BF16 also does is training, not FP8 risk. The excess is measured in a
*unit*, the excess that on its own should count as a clear warning::

    e_i  = max(0, policy_i - reference_i) / unit_i                 (rates, bounded values)
    e_i  = max(0, policy_i - reference_i) / (unit_i * max(|reference_i|, floor_i))   (levels, relative)
    risk = 1 - exp(-sum_i e_i)

Why this form: it is 0 exactly when no signal exceeds BF16, rises strictly with each excess, and stays
below 1. It is a noisy-OR of per-signal risks ``1 - exp(-e_i)``: independent warnings add up, one very
strong warning alone saturates it, and no signal can cancel another (a policy that is calmer than BF16 on
one signal gets no credit on the others). ``risk >= 0.5`` (:data:`THRESHOLD`; ``sum e_i >= ln 2``: one
signal 0.69 units above BF16, or several smaller) flags a policy as risky.

The units (:data:`TERMS`) are priors, not fits: doubling of the block-output kurtosis or of the max
attention logit relative to BF16; 0.25 in ln units per 100 steps of extra amax or grad-norm growth (x1.28
per 100 steps, x7 over 800); 0.1 of extra mean gate/up ``|cos|`` (random rows sit near
``sqrt(2 / (pi * dim))``, 0.02 at dim 2048). ``scripts/bench_fidelity.py`` is the place to calibrate them
against long runs. A signal missing from either run contributes nothing and is listed in
:attr:`Risk.missing`, so a score from fewer signals is visible as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from precsearch.probe.signals import Signals

THRESHOLD = 0.5
"""Risk at or above this flags a policy."""


@dataclass(frozen=True)
class Term:
    """How one signal enters the score.

    Attributes:
        signal: The :class:`~precsearch.probe.signals.Signals` field.
        unit: The excess over BF16 that counts as one unit.
        relative: Excess relative to ``max(|reference|, floor)`` (levels) rather than absolute (rates).
        floor: Smallest reference magnitude a relative excess is taken against.
    """

    signal: str
    unit: float
    relative: bool = False
    floor: float = 1.0

    def excess(self, policy: float, reference: float) -> float:
        """Units by which ``policy`` exceeds ``reference`` (0 when it does not)."""
        over = max(0.0, policy - reference)
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


def risk_score(policy: Signals, reference: Signals, terms: tuple[Term, ...] = TERMS) -> Risk:
    """The policy's risk against its BF16 reference (module docstring)."""
    excess, missing = {}, []
    for term in terms:
        p, r = getattr(policy, term.signal), getattr(reference, term.signal)
        if math.isnan(p) or math.isnan(r):
            missing.append(term.signal)
        else:
            excess[term.signal] = term.excess(p, r)
    return Risk(score=1.0 - math.exp(-sum(excess.values())), excess=excess, missing=tuple(missing))
