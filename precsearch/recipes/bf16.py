"""BF16: the reference every layer runs unless a rule makes it low precision; nothing to quantize."""

from __future__ import annotations

from precsearch.precision import Precision
from precsearch.recipes.base import Recipe
from precsearch.recipes.spec import PrecisionSpec
from precsearch.soak import REFERENCE_ROW, SoakFinding


class BF16(Recipe):
    """No scales, no quantizer, no TE recipe; Megatron's precision config file names it ``bf16``."""

    precision = Precision.BF16
    spec = PrecisionSpec("BF16", 16, megatron_config="bf16")
    te_stats_observable = False
    soak = SoakFinding(REFERENCE_ROW, 0.0, 0.0, 8)  # the pair of every row
