"""Precision names and per-layer FP8 recipe settings.

These are plain data shared by the search space, the policy file and every
numeric backend. They hold names (strings and enums), never classes, so that
they round-trip through YAML, Optuna parameters and MLflow params.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class Precision(str, Enum):
    """How one Linear layer computes its GEMMs."""

    BF16 = "bf16"
    FP8_DELAYED = "fp8_delayed"  # per-tensor scale from an amax history (TE DelayedScaling)
    FP8_CURRENT = "fp8_current"  # per-tensor scale from this tensor's amax (TE Float8CurrentScaling)
    FP8_BLOCK = "fp8_block"  # 1x128 activation / 128x128 weight blocks (TE Float8BlockScaling)
    MXFP8 = "mxfp8"  # 1x32 blocks, power-of-two E8M0 scales (TE MXFP8BlockScaling, Blackwell)
    NVFP4 = "nvfp4"  # FP4 E2M1 with 16-element blocks (TE NVFP4BlockScaling, Blackwell)
    FP8_ROWWISE = "fp8_rowwise"  # a power-of-two scale per row, E4M3 everywhere (torchao's rowwise recipe)

    @property
    def is_fp8(self) -> bool:
        """True for every low-precision choice (FP8 and FP4), False for BF16."""
        return self is not Precision.BF16


class Fp8Format(str, Enum):
    """Which FP8 encodings the forward and backward passes use."""

    E4M3 = "e4m3"  # E4M3 everywhere, gradients too
    HYBRID = "hybrid"  # E4M3 forward (activations, weights), E5M2 backward (gradients)


class AmaxAlgo(str, Enum):
    """How delayed scaling reduces its amax history to one amax."""

    MAX = "max"
    MOST_RECENT = "most_recent"


#: Longest amax history accepted: far above the 1024 of TE and Megatron defaults; each FP8 tensor keeps
#: one float per step of it, so 10**12 would try to allocate terabytes at the first step.
MAX_AMAX_HISTORY = 65536
#: Largest margin accepted: with a margin of 18, E4M3's largest value (448) scaled by 2**-18 falls below
#: its smallest subnormal (2**-9), so every value of a delayed-scaling tensor would flush to zero.
MAX_MARGIN = 17


@dataclass(frozen=True)
class LayerRecipe:
    """The numeric recipe one Linear layer runs with.

    Attributes:
        precision: BF16 or one of the FP8/FP4 recipes.
        fp8_format: E4M3 everywhere, or E4M3 forward with E5M2 gradients.
        amax_history_len: Delayed scaling only: steps of amax kept.
        amax_compute_algo: Delayed scaling only: reduce the history by max or take the newest.
        margin: Delayed scaling only: the scale is divided by 2**margin for headroom.
        nvfp4_rht: NVFP4 only: random Hadamard transform of the weight-gradient GEMM's
            inputs (TE ``NVFP4BlockScaling(disable_rht=not ...)``).
        nvfp4_2d_weights: NVFP4 only: 16x16 weight tiles, so forward and backward see one
            quantized weight (else 1x16 blocks; TE ``disable_2d_quantization=not ...``).
        nvfp4_stochastic_rounding: NVFP4 only: gradients rounded stochastically
            (TE ``disable_stochastic_rounding=not ...``).
    """

    precision: Precision = Precision.BF16
    fp8_format: Fp8Format = Fp8Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: AmaxAlgo = AmaxAlgo.MAX
    margin: int = 0
    nvfp4_rht: bool = True
    nvfp4_2d_weights: bool = True
    nvfp4_stochastic_rounding: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision(self.precision))
        object.__setattr__(self, "fp8_format", Fp8Format(self.fp8_format))
        object.__setattr__(self, "amax_compute_algo", AmaxAlgo(self.amax_compute_algo))
        if not 1 <= self.amax_history_len <= MAX_AMAX_HISTORY:
            raise ValueError(f"amax_history_len must be >= 1 and at most {MAX_AMAX_HISTORY}")
        if not 0 <= self.margin <= MAX_MARGIN:
            raise ValueError(f"margin must be >= 0 and at most {MAX_MARGIN}")
        for name in NVFP4_KNOBS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (enum values as strings)."""
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items()}


#: The NVFP4 recipe switches of :class:`LayerRecipe` (all on by default, as in TE's NVFP4BlockScaling).
NVFP4_KNOBS = ("nvfp4_rht", "nvfp4_2d_weights", "nvfp4_stochastic_rounding")

BF16_RECIPE = LayerRecipe()
