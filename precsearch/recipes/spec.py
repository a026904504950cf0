"""A precision's facts as one frozen row (:class:`PrecisionSpec`), and the GPU generations they name.

Each recipe module of this package holds its row (:attr:`~precsearch.recipes.base.Recipe.spec`);
:data:`precsearch.precision_spec.SPECS` is the table of them, read from the registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
            (``(1, 128)``); None for one scale per tensor or per row (or none at all, BF16): such
            scales do not grow with a row's length, so the bytes below leave them out.
        weight_block: The same for a weight (``(128, 128)``); None for one scale per tensor.
        scale_bytes: Bytes of one block scale (an fp32 scale: 4; E8M0 or E4M3: 1).
        min_capability: The lowest CUDA compute capability whose tensor cores run it (Transformer
            Engine's rule, or torch's ``_scaled_mm`` for a recipe TE lacks); None for BF16, which runs
            anywhere.
        gemm_speedup: Nominal GEMM rate over BF16 (dense tensor-core peak, Hopper and Blackwell; FP4
            runs at twice FP8's rate on Blackwell); used only for predicted speeds.
        te_recipe: The ``transformer_engine.common.recipe`` class; None for BF16 or a recipe TE lacks.
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
        # per-tensor and per-row scales are left out: 4 bytes per tensor, or per row of thousands of elements
        data = self.data_bits / 8
        return data + self.scale_bytes / math.prod(block) if block else data
