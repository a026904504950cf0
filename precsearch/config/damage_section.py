"""``objectives.damage``: the fixed-state damage reading (:mod:`precsearch.probe.damage`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from precsearch.config.section import Section
from precsearch.readings.damage import DEFAULT_STATES
from precsearch.utils.numbers import MAX_COUNT

#: Llama 3's training batch, in tokens: the 405B model trained at 4M tokens per step in its first stage
#: (Llama 3 paper, section 3.4.1) and the smaller models at similar sizes; 2**22 = 4,194,304.
LLAMA3_TOKENS_PER_STEP = 2**22

DamageMeasure = Literal["grad_noise", "grad_bias_noise", "grad_var_noise", "grad_norm", "update_noise", "update_norm",
                        "forward"]


#: Each figure's limit when ``objectives.damage.limit`` is not given (above it: unstable). The noise-unit
#: figures at 1 (the error as large as a step's gradient noise); grad_norm at 1% of the squared norm (a bias a tenth
#: of the gradient's); forward at a 0.25% loss change (what DeepSeek-V3 accepts as FP8's error over a whole run).
#: update_norm's is placed on the judge's decided cases (benchmarks/place_limit.py on the soak judge, H100,
#: 2026-12-06; docs/stability-reading.md#where-the-limit-comes-from): at the probe's state every case the soak
#: decided benign reads at most 0.00155 (value + 2 SE; FP8 block-scaled GEMMs with fp8_block moments), the damaging
#: ones from 0.00219 (BF16 weights without a master copy, +6.4% at 2,000 steps); 0.002 calls the benign ones stable
#: and none of the damaging ones stable.
DEFAULT_LIMITS: dict[str, float] = {"grad_noise": 1.0, "grad_bias_noise": 1.0, "grad_var_noise": 1.0,
                                    "update_noise": 1.0, "grad_norm": 0.01, "update_norm": 0.002, "forward": 0.0025}



class DamageSection(Section):
    """The fixed-state reading's settings; used when ``objectives.reading`` is ``damage``, else off."""

    states: list[float] = Field(
        list(DEFAULT_STATES), min_length=1, description="states of the BF16 reference run read at, as fractions of "
        "probe.steps (0: its start, the init or model.init_from; 1: its end); default [0.5, 1.0], and "
        "[0.0, 0.5, 1.0] with model.init_from (the checkpoint, where FP8 meets its outliers)")
    batches: int = Field(4, ge=3, le=64, description="independent batches per state: their BF16 gradients' "
                         "spread is the gradient noise (3 or more, for a standard error)")
    warm_batches: int = Field(2, ge=0, le=64, description="passes before measuring, to fill delayed scaling's "
                              "amax history (not measured; only for policies with delayed units)")
    tokens_per_step: int = Field(
        LLAMA3_TOKENS_PER_STEP, gt=0, le=MAX_COUNT, description="the training run's tokens per optimizer step the verdict is "
        "for: the noise of a B-token batch shrinks as 1/B (default 4,194,304, Llama 3's)")
    measure: DamageMeasure = Field(
        "update_norm", description="the figure read as instability (see precsearch.probe.damage.reading); the "
        "default, update_norm, does not depend on tokens_per_step and sees the memory knobs")
    limit: float | None = Field(None, gt=0, description="stable when the reading (the largest over the states) is "
                                "at most this; default: the measure's (DEFAULT_LIMITS: 0.002 for update_norm)")
    keep_states: Literal["auto", "host", "device", "disk"] = Field(
        "auto", description="where the BF16 run's states (FP32 weights and AdamW moments) are kept between trials: "
        "host = host memory (page-locked beside an accelerator), copied to the accelerator by every reading; "
        "device = on the accelerator, no copies, at about 3 x 4 bytes per unit weight plus 4 bytes per other "
        "parameter per state of device memory; disk = in anonymous temporary files (TMPDIR) with the BF16 "
        "gradients, and a policy's gradients at a state too while it is read (on a CPU the BF16 run's moments "
        "between its steps too): no memory held between trials, each read back a slice at a time, to the same "
        "figures; auto = on an accelerator, on it when they fit there "
        "beside what is held and the trials' working set, else host; on a CPU, disk when they would hold over "
        "256 MiB in memory and the files take at most half the free space there, else host; decided per clipping "
        "value (precsearch/probe/damage/placement.py)")
    compile_compare: bool = Field(
        True, description="on CUDA, fuse each chunk's compare step (two AdamW updates, the errors) into a few "
        "kernels with torch.compile, once per process; off: op by op, as on a CPU (the same figures to float32 "
        "rounding of the updates)")

    standard_reference: bool = Field(
        True, strict=True, description="also read the standard FP8 recipe (Megatron-Core's default: delayed scaling on "
        "every block Linear, or current scaling where the backend has no delayed; BF16 output layer; the baseline's "
        "optimizer state) once per clip value, at the same states and batches, and show each trial's reading as a "
        "multiple of it; one more reading per clip value, kept in references/ (false: off)")

    def state_steps(self, probe_steps: int) -> list[int]:
        """The BF16 run's steps read at: ``states`` of ``probe_steps`` (0 the start), sorted, without repeats."""
        return sorted({round(f * probe_steps) for f in self.states})

    @field_validator("states")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        bad = [f for f in v if not 0 <= f <= 1]
        if bad:
            raise ValueError(f"states are fractions of probe.steps in [0, 1], got {bad}")
        return v

    @model_validator(mode="after")
    def _measure_limit(self) -> "DamageSection":
        if self.limit is None:  # frozen: set once, here, from the measure's table entry
            object.__setattr__(self, "limit", DEFAULT_LIMITS[self.measure])
        return self
