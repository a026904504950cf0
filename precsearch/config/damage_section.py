"""``objectives.damage``: the fixed-state damage reading (:mod:`precsearch.probe.damage`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from precsearch.config.section import Section
from precsearch.utils.numbers import MAX_COUNT

#: Llama 3's training batch, in tokens: the 405B model trained at 4M tokens per step in its first stage
#: (Llama 3 paper, section 3.4.1) and the smaller models at similar sizes; 2**22 = 4,194,304.
LLAMA3_TOKENS_PER_STEP = 2**22

DamageMeasure = Literal["grad_noise", "grad_bias_noise", "grad_var_noise", "grad_norm", "update_noise", "forward"]


class DamageSection(Section):
    """The fixed-state reading's settings; used when ``objectives.reading`` is ``damage``, else off."""

    states: list[float] = Field(
        [0.5, 1.0], min_length=1, description="states of the BF16 reference run read at, as fractions of "
        "probe.steps (0: its start, the init or model.init_from; 1: its end)")
    batches: int = Field(4, ge=3, le=64, description="independent batches per state: their BF16 gradients' "
                         "spread is the gradient noise (3 or more, for a standard error)")
    warm_batches: int = Field(2, ge=0, le=64, description="passes before measuring, to fill delayed scaling's "
                              "amax history (not measured; only for policies with delayed units)")
    tokens_per_step: int = Field(
        LLAMA3_TOKENS_PER_STEP, gt=0, le=MAX_COUNT, description="the training run's tokens per optimizer step the verdict is "
        "for: the noise of a B-token batch shrinks as 1/B (default 4,194,304, Llama 3's)")
    measure: DamageMeasure = Field(
        "grad_noise", description="the figure read as instability (see precsearch.probe.damage.reading)")
    limit: float = Field(1.0, gt=0, description="stable when the reading (the largest over the states) is at "
                         "most this")

    @field_validator("states")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        bad = [f for f in v if not 0 <= f <= 1]
        if bad:
            raise ValueError(f"states are fractions of probe.steps in [0, 1], got {bad}")
        return v
