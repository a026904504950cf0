"""The model's shape and its precision units: data about a Llama 3, no modules.

:mod:`~precsearch.arch.config` holds the sizes and presets,
:mod:`~precsearch.arch.units` the names of the modules a policy assigns
precisions to (Megatron-Core's layout, with Hugging Face names as aliases).
"""

from precsearch.arch.config import PRESETS, ModelConfig, RopeScaling, rope_inv_freq, unsplittable
from precsearch.arch.units import (BLOCK_UNITS, HF_BLOCK_PROJS, HF_OUTPUT_LAYER, NORMED_UNITS, OUTPUT_LAYER,
                                   hf_linear_names, hf_names, layer_names, unit_names, unit_of, unit_shape)

__all__ = ["BLOCK_UNITS", "HF_BLOCK_PROJS", "HF_OUTPUT_LAYER", "NORMED_UNITS", "OUTPUT_LAYER", "PRESETS", "ModelConfig",
           "RopeScaling", "hf_linear_names", "hf_names", "layer_names", "rope_inv_freq", "unit_names", "unit_of",
           "unit_shape", "unsplittable"]
