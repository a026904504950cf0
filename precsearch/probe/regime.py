"""Is the BF16 reference itself smooth? The regime check run before a study's trials.

A loss gap against BF16 only means something if the BF16 run is a steady yardstick. A probe trained
at the edge of stability (too high a learning rate, too short a warm-up, too few tokens per step)
amplifies any perturbation, FP8 rounding included, into percent-level loss differences within tens
of steps (issue 28: the 8B space's BF16 reference spiked, its max attention logit reached 1012 and
block 0's output amax went 13 -> 7296 in 40 steps). This module reads what the reference probes
already recorded (per-step events, :mod:`precsearch.probe.measure.events`; early-warning signals,
:mod:`precsearch.probe.measure.signals`) and says which signal, at which seed and step, is out of bounds.
It runs nothing. The thresholds and why each has its value are documented beside them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from precsearch.probe.result import ProbeResult

#: Loss spikes a smooth BF16 reference may have. None: a spike (``probe.spike_threshold`` above the running
#: mean) in the yardstick itself means the regime, not the precision, moves the loss; the spike penalty
#: and the loss gap would then score the reference's own noise.
MAX_LOSS_SPIKES = 0
#: Gradient-norm blow-ups (``probe.grad_blowup_factor`` times the recent median) allowed, for the same reason.
MAX_GRAD_BLOWUPS = 0
#: Largest max causal attention logit (any block, any stat step). q and k are BF16, each rounded to a
#: relative 2^-9, so a logit of 2^8 = 256 carries a rounding error of order 1: the attention weights
#: of near-tied keys are then set by rounding (a logit error of 1 is a factor e in weight). Healthy
#: short probes read tens (the CPU quickstart: 20 by step 50, docs/regime.md); Wortsman et al. 2023 (arXiv
#: 2309.14322) see logits growing past 10^3 before attention-entropy collapse.
MAX_ATTENTION_LOGIT = 256.0
#: Largest growth of a block output's amax over the run (its peak over its first stat step's value).
#: Massive activations (Sun et al. 2024, arXiv 2402.17762) form over billions of tokens; a hundredfold
#: growth within a probe of at most millions of tokens is updates too large for the residual stream,
#: and amax running ahead of the FP8 scaling history is what the FP8 trials would then hit.
MAX_BLOCK_AMAX_GROWTH = 100.0
#: ... and only once the peak also exceeds this: the order of the massive activations of a fully trained
#: Llama 2 7B (Sun et al.: ~2,000 in a few channels). Below it, a hundredfold growth is a small init
#: reaching its working scale: the CPU quickstart's block 0 goes 0.2 -> 21 in 60 smooth steps (x102).
BLOCK_AMAX_FLOOR = 1000.0


@dataclass(frozen=True)
class Finding:
    """One signal of one reference seed that is out of bounds.

    Attributes:
        seed: The reference probe's seed.
        signal: ``loss_spike``, ``grad_blowup``, ``non_finite``, ``attention_logit`` or ``block_amax``.
        evidence: What was measured, in words (``max attention logit 1012 at step 38 (limit 256)``).
    """

    seed: int
    signal: str
    evidence: str


@dataclass(frozen=True)
class RegimeVerdict:
    """The regime check of a set of BF16 references: smooth when nothing was found."""

    findings: tuple[Finding, ...]

    @property
    def smooth(self) -> bool:
        """True when no reference seed had a signal out of bounds."""
        return not self.findings

    def evidence(self) -> str:
        """The findings in one line, by seed."""
        seeds = sorted({f.seed for f in self.findings})
        return "; ".join(f"seed {s}: " + ", ".join(f.evidence for f in self.findings if f.seed == s) for s in seeds)


def check_regime(references: Sequence[ProbeResult], seeds: Sequence[int]) -> RegimeVerdict:
    """The regime check of BF16 reference probes (one per seed, in ``seeds``' order)."""
    findings: list[Finding] = []
    for seed, result in zip(seeds, references, strict=True):
        findings += _event_findings(seed, result) + _signal_findings(seed, result)
    return RegimeVerdict(tuple(findings))


def _event_findings(seed: int, result: ProbeResult) -> list[Finding]:
    found = []
    for kind, allowed, what in (("loss_spike", MAX_LOSS_SPIKES, "loss spike"),
                                ("grad_blowup", MAX_GRAD_BLOWUPS, "gradient blow-up"),
                                ("non_finite", 0, "non-finite step")):
        events = [e for e in result.events if e["kind"] == kind]
        if len(events) <= allowed:
            continue
        steps = ", ".join(str(e["step"]) for e in events[:5]) + (", ..." if len(events) > 5 else "")
        plural = "s" if len(events) > 1 else ""
        first = events[0]
        against = f" ({'the first ' if plural else ''}{first['value']:.4g} against {first['baseline']:.4g})"
        found.append(Finding(seed, kind, f"{len(events)} {what}{plural} at step{plural} {steps}"
                                         f"{against if kind != 'non_finite' else ''}"))
    return found


def _signal_findings(seed: int, result: ProbeResult) -> list[Finding]:
    series = (result.signals or {}).get("series", {})
    found = []
    logits = [(s, v) for s, v in series.get("attention_logit", []) if math.isfinite(v)]
    if logits:
        step, peak = max(logits, key=lambda p: p[1])
        if peak > MAX_ATTENTION_LOGIT:
            found.append(Finding(seed, "attention_logit", f"max attention logit {peak:.4g} at step {step} "
                                                          f"(limit {MAX_ATTENTION_LOGIT:g})"))
    amax = [(s, v) for s, v in series.get("block_amax", []) if math.isfinite(v) and v > 0]
    tensor = (result.signals or {}).get("block_amax_at", "")
    if len(amax) >= 2:
        first, (step, peak) = amax[0][1], max(amax, key=lambda p: p[1])
        if peak / first > MAX_BLOCK_AMAX_GROWTH and peak > BLOCK_AMAX_FLOOR:
            limit = f"limit x{MAX_BLOCK_AMAX_GROWTH:g} past {BLOCK_AMAX_FLOOR:g}"
            found.append(Finding(seed, "block_amax", f"{tensor} amax {first:.3g} -> {peak:.4g} by step {step} "
                                                     f"(x{peak / first:.0f}; {limit})"))
    return found


def advice(tokens_per_step: int, lr: float, warmup: int, grad_accum: int) -> str:
    """What to change, with the space's current values."""
    return (f"lower probe.lr (now {lr:g}; Llama 3 8B trained at 3e-4), lengthen probe.lr_warmup_steps "
            f"(now {warmup}), or raise the tokens per step with probe.grad_accum (now {grad_accum}) or "
            f"probe.micro_batch (now {tokens_per_step:,} tokens a step)")
