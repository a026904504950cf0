"""Scoring a probe against its paired BF16 reference.

* memory saved = 1 - peak(policy) / peak(BF16 reference);
* loss gap = (eval loss(policy) - eval loss(reference)) / eval loss(reference),
  on the fixed held-out batches, not the noisy training batches;
* instability = max(loss gap, 0) + spike_penalty x (spikes beyond the
  reference's); a diverged probe scores :data:`DIVERGED_INSTABILITY`;
* feasible = not diverged and instability <= the stability limit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from precsearch.config.space import ObjectivesSection
from precsearch.probe.result import ProbeResult

#: Instability given to a diverged probe: far outside any sensible stability limit.
DIVERGED_INSTABILITY = 1.0


@dataclass(frozen=True)
class Score:
    """A trial's objectives and the figures behind them."""

    memory_saved: float
    loss_gap: float
    instability: float
    spikes: int
    diverged: bool
    tokens_per_s: float
    speedup: float
    feasible: bool

    def to_dict(self) -> dict:
        return asdict(self)


def count_spikes(losses: list[float], threshold: float, warmup: int = 3, alpha: float = 0.1) -> int:
    """Steps whose loss jumps more than ``threshold`` (relative) above a running mean."""
    spikes, mean = 0, None
    for step, loss in enumerate(losses):
        if not math.isfinite(loss):
            break
        if mean is not None and step >= warmup and loss > mean * (1 + threshold):
            spikes += 1
        mean = loss if mean is None else (1 - alpha) * mean + alpha * loss
    return spikes


def score(result: ProbeResult, reference: ProbeResult, objectives: ObjectivesSection) -> Score:
    """Score ``result`` against the BF16 ``reference`` run on the same data, seed and steps."""
    memory_saved = 1.0 - result.peak_memory_bytes / reference.peak_memory_bytes
    speedup = result.tokens_per_s / reference.tokens_per_s if reference.tokens_per_s else 0.0
    excess = max(0, count_spikes(result.losses, objectives.spike_threshold)
                 - count_spikes(reference.losses, objectives.spike_threshold))
    diverged = result.diverged or not math.isfinite(result.eval_loss)
    if diverged:
        gap, instability = math.nan, DIVERGED_INSTABILITY
    else:
        gap = (result.eval_loss - reference.eval_loss) / reference.eval_loss
        instability = max(gap, 0.0) + objectives.spike_penalty * excess
    return Score(
        memory_saved=memory_saved,
        loss_gap=gap,
        instability=instability,
        spikes=excess,
        diverged=diverged,
        tokens_per_s=result.tokens_per_s,
        speedup=speedup,
        feasible=not diverged and instability <= objectives.stability_limit,
    )


def objective_names(objectives: ObjectivesSection) -> list[str]:
    """The enabled objectives, in the order the study reports them."""
    names = [("memory_saved", objectives.memory), ("instability", objectives.instability),
             ("tokens_per_s", objectives.throughput)]
    return [n for n, on in names if on]


DIRECTIONS = {"memory_saved": "maximize", "instability": "minimize", "tokens_per_s": "maximize"}


def objective_values(s: Score, objectives: ObjectivesSection) -> list[float]:
    """The values Optuna optimises, in :func:`objective_names` order."""
    return [float(getattr(s, n)) for n in objective_names(objectives)]


def constraint_value(s: Score, objectives: ObjectivesSection) -> float:
    """<= 0 when feasible (Optuna's convention)."""
    if s.diverged:
        return DIVERGED_INSTABILITY
    return s.instability - objectives.stability_limit
