"""The model's shape and its precision units: data about a Llama 3, no modules.

:mod:`~precsearch.arch.config` holds the sizes and presets,
:mod:`~precsearch.arch.units` the names of the modules a policy assigns
precisions to (Megatron-Core's layout, with Hugging Face names as aliases).
"""

from precsearch.arch.config import PRESETS, ModelConfig, RopeScaling, rope_inv_freq
from precsearch.arch.units import OUTPUT_LAYER, hf_names, unit_names, unit_of

__all__ = ["OUTPUT_LAYER", "PRESETS", "ModelConfig", "RopeScaling", "hf_names", "rope_inv_freq", "unit_names",
           "unit_of"]
