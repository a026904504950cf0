"""The facts of each precision, in one table (:data:`SPECS`) that every consumer reads.

A precision's storage (element width, scale blocks and scale bytes), the lowest GPU whose tensor
cores run it, its nominal GEMM rate and its name in each framework are written here once. The
memory model takes its bytes per element from here, the capability checks their minimum GPU and
labels, the backends their recipe names, the numerics their block sizes and the exporters the
names their frameworks know. A framework that has no name for a precision holds None, and the
consumer says why not (``tests/test_precision_spec.py`` checks that each consumer covers every
precision or gives a reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from precsearch.precision import Precision

Capability = tuple[int, int]

ADA: Capability = (8, 9)
HOPPER: Capability = (9, 0)
BLACKWELL: Capability = (10, 0)


@dataclass(frozen=True)
class PrecisionSpec:
    """One precision's facts.

    Attributes:
        label: The name messages use ("FP8 block scaling").
        data_bits: Bits per stored element (16, 8, 4).
        activation_block: Elements sharing one scale in an activation or gradient, as a tile
            (``(1, 128)``); None for one scale per tensor (or none at all, BF16).
        weight_block: The same for a weight (``(128, 128)``); None for one scale per tensor.
        scale_bytes: Bytes of one block scale (an fp32 scale: 4; E8M0 or E4M3: 1).
        min_capability: The lowest CUDA compute capability whose tensor cores run it (Transformer
            Engine's rule); None for BF16, which runs anywhere.
        gemm_speedup: Nominal GEMM rate over BF16 (dense tensor-core peak, Hopper and Blackwell; FP4
            runs at twice FP8's rate on Blackwell); used only for predicted speeds.
        te_recipe: The ``transformer_engine.common.recipe`` class; None for BF16.
        megatron_recipe: Megatron-LM's ``--fp8-recipe`` value (``--fp4-recipe`` for NVFP4); None:
            not a Megatron global recipe.
        megatron_config: The key of its config in Megatron's per-module precision config file; None:
            the file cannot select it (delayed scaling is global only).
        torchao_recipe: torchao's ``Float8LinearRecipeName`` value; None: not mapped to torchao.
        torchtitan: (converter, its section key, recipe) in torchtitan's config; None: no converter.
    """

    label: str
    data_bits: int
    activation_block: tuple[int, int] | None = None
    weight_block: tuple[int, int] | None = None
    scale_bytes: int = 0
    min_capability: Capability | None = None
    gemm_speedup: float = 1.0
    te_recipe: str | None = None
    megatron_recipe: str | None = None
    megatron_config: str | None = None
    torchao_recipe: str | None = None
    torchtitan: tuple[str, str, str] | None = None

    @property
    def activation_bytes(self) -> float:
        """Bytes per element of a stored activation, its block scales included."""
        return self._bytes(self.activation_block)

    @property
    def weight_bytes(self) -> float:
        """Bytes per element of one layout of a stored weight, its block scales included."""
        return self._bytes(self.weight_block)

    def _bytes(self, block: tuple[int, int] | None) -> float:
        # per-tensor scales (4 bytes per tensor) are left out: they do not grow with the tensor
        data = self.data_bits / 8
        return data + self.scale_bytes / math.prod(block) if block else data


SPECS: dict[Precision, PrecisionSpec] = {
    Precision.BF16: PrecisionSpec("BF16", 16, megatron_config="bf16"),
    Precision.FP8_DELAYED: PrecisionSpec(
        "FP8 delayed scaling", 8, min_capability=ADA, gemm_speedup=2.0, te_recipe="DelayedScaling",
        megatron_recipe="delayed"),
    Precision.FP8_CURRENT: PrecisionSpec(
        "FP8 current scaling", 8, min_capability=ADA, gemm_speedup=2.0, te_recipe="Float8CurrentScaling",
        megatron_recipe="tensorwise", megatron_config="fp8_tensorwise", torchao_recipe="tensorwise",
        torchtitan=("quantize.linear.float8", "float8", "tensorwise")),
    Precision.FP8_BLOCK: PrecisionSpec(  # an fp32 scale per 1x128 activation block, per 128x128 weight block
        "FP8 block scaling", 8, (1, 128), (128, 128), 4, min_capability=HOPPER, gemm_speedup=2.0,
        te_recipe="Float8BlockScaling", megatron_recipe="blockwise", megatron_config="fp8_blockwise"),
    Precision.MXFP8: PrecisionSpec(  # an E8M0 scale per 32 elements
        "MXFP8", 8, (1, 32), (1, 32), 1, min_capability=BLACKWELL, gemm_speedup=2.0,
        te_recipe="MXFP8BlockScaling", megatron_recipe="mxfp8", megatron_config="mxfp8",
        torchtitan=("quantize.linear.mx", "mx", "mxfp8_cublas_rceil")),
    Precision.NVFP4: PrecisionSpec(  # an E4M3 scale per 16 elements; weights: TE's default 16x16 tiles
        "NVFP4", 4, (1, 16), (16, 16), 1, min_capability=BLACKWELL, gemm_speedup=4.0,
        te_recipe="NVFP4BlockScaling", megatron_recipe="nvfp4", megatron_config="nvfp4"),
}
"""Precision -> its facts; every :class:`~precsearch.precision.Precision` has a row."""


def spec_of(precision: Precision | str) -> PrecisionSpec:
    """The facts of ``precision`` (a :class:`~precsearch.precision.Precision` or its value)."""
    return SPECS[Precision(precision)]
