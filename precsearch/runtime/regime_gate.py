"""What a study does when its BF16 reference is not smooth (``objectives.regime_check``).

The check itself is :func:`precsearch.probe.regime.check_regime`; here its verdict is said once per
distinct set of references (gradient clipping, rung), before the first trial's own probe runs:
``warn`` says it and goes on, ``refuse`` stops the study (exit 2), ``off`` skips the check.
"""

from __future__ import annotations

from collections.abc import Callable

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.probe.regime import RegimeVerdict, advice, check_regime
from precsearch.probe.result import ProbeResult


def regime_message(space: Space, verdict: RegimeVerdict, what: str) -> str:
    """The warning (or refusal) for a verdict that is not smooth; ``what`` names the references."""
    p = space.probe
    tokens = p.micro_batch * p.seq_len * p.grad_accum
    return (f"the BF16 reference ({what}) is not smooth: {verdict.evidence()}. The probe trains at the edge of "
            f"stability, where training can amplify a perturbation the size of FP8 rounding into loss gaps of "
            f"percents; to fix it, {advice(tokens, p.lr, p.lr_warmup_steps, p.grad_accum)} "
            f"(objectives.regime_check: warn | refuse | off, now {space.objectives.regime_check})")


def gate_regime(space: Space, seeds: list[ProbeResult], what: str, say: Callable[[str], None]) -> RegimeVerdict | None:
    """Check the reference seeds ``seeds`` (``probe.seed`` first) and act as ``objectives.regime_check`` says.

    Returns:
        The verdict, or None with ``off``.

    Raises:
        UserError: with ``refuse``, naming ``probe.lr`` (the first field to change) when not smooth.
    """
    mode = space.objectives.regime_check
    if mode == "off":
        return None
    verdict = check_regime(seeds, [space.probe.seed + i for i in range(len(seeds))])
    if verdict.smooth:
        return verdict
    message = regime_message(space, verdict, what)
    if mode == "refuse":
        raise UserError(message, field="probe.lr")
    say(message)
    return verdict


class RegimeGate:
    """One worker's regime checks: each distinct set of references (clipping value, rung) is checked once, before
    the first trial scored against it.

    Args:
        space: The study's space (``objectives.regime_check``, the probe the advice names).
        say: Where a warning goes.
    """

    def __init__(self, space: Space, say: Callable[[str], None]):
        self._space, self._say = space, say
        self._checked: set[tuple[float | None, int]] = set()

    def check(self, seeds: list[ProbeResult], clip_grad: float | None, rung: int) -> None:
        """:func:`gate_regime` of the references of ``clip_grad`` at ``rung`` steps, the first time they come."""
        if (clip_grad, rung) in self._checked:
            return
        self._checked.add((clip_grad, rung))
        gate_regime(self._space, seeds, f"clip_grad {clip_grad}, {rung} steps", self._say)
