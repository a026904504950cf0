"""FP8 statistics of Transformer Engine layers, from hooks on the tensors TE quantizes.

TE's own route to per-tensor FP8 statistics is its debug API (the
``LogFp8TensorStats`` feature), which needs NVIDIA DL Framework Inspect:
``transformer_engine/debug/features/api.py`` imports ``nvdlfw_inspect`` at
module level, and ``transformer_engine/debug/__init__.py`` swallows the
ImportError, so without that package the features are simply absent. The H200
machine has no network to install it; statistics are therefore computed here
from the tensors themselves, captured where :class:`~precsearch.backends.te.
TEPrecisionLinear` hands them to TE, against the scale TE uses:

* **Delayed scaling**: the scale is TE's own, read from the module's
  ``fp8_meta["scaling_fwd"].scale`` (slots input, weight) and
  ``fp8_meta["scaling_bwd"].scale`` (slot grad_output), both
  ``DelayedScalingRecipeState`` (``transformer_engine/pytorch/quantization.py``).
  They are read before TE updates them: the forward update runs when the
  outermost ``te.autocast`` exits, after the layer's forward; the backward one
  in the backward of the step's first FP8 module, after the gradient hook of
  every layer has fired (that module runs last in backward and its hook fires
  before its own backward). TE records the same amax in ``amax_history``
  (checked on the GPU: ``tests/backends/test_gpu_diagnostics.py``).
* **Current, block and MX scaling** keep no scale between casts
  (``Float8CurrentScalingQuantizer`` holds none; ``tensor/float8_tensor.py``), so
  the scale is recomputed by the emulated scaler of the same recipe
  (:func:`~precsearch.fp8.scaling.make_scaler`), whose defaults are TE's:
  current scaling without power-of-two scales (``Float8CurrentScaling``, unless
  ``NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES=1``), block scaling with
  power-of-two scales on 1x128 activation/gradient and 128x128 weight tiles
  (``Float8BlockScaling``), MXFP8 with 1x32 E8M0 tiles.

What TE quantizes (``transformer_engine/pytorch/module/linear.py``): the input
after casting it to the activation dtype (the torch autocast dtype when
autocast is on), the weight parameter as stored, and the gradient of the
output as it arrives. NVFP4 layers report nothing: their casts (stochastic
rounding, the Hadamard-rotated wgrad copies) are emulated by the emulated
backend, but reproducing them beside TE's kernels is not wired here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from precsearch.fp8.formats import quantization_stats
from precsearch.fp8.scaling import make_scaler, role_format
from precsearch.precision import LayerRecipe
from precsearch.recipes import recipe_for

#: TE delayed-scaling state key and slot of each role (``csrc/common.h``: FP8FwdTensors, FP8BwdTensors).
_DELAYED_SLOT = {"input": ("scaling_fwd", 0), "weight": ("scaling_fwd", 1), "grad_output": ("scaling_bwd", 0)}


def observable(recipe: LayerRecipe) -> bool:
    """True when this layer's FP8 casts are reproduced here (every FP8 recipe; NVFP4 is not wired)."""
    return recipe_for(recipe.precision).te_stats_observable


def activation(x: Tensor) -> Tensor:
    """``x`` as TE quantizes it: cast to the autocast dtype when autocast is on, as a 2-d matrix."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        x = x.to(torch.get_autocast_dtype(kind))
    return x.detach().reshape(-1, x.shape[-1])


def high_precision_weight(weight: Tensor) -> Tensor:
    """The weight's values (an FP8 primary weight is dequantized: its cast already happened)."""
    weight = weight.detach()
    return weight.dequantize() if hasattr(weight, "dequantize") else weight


@torch.no_grad()
def operand_stats(recipe: LayerRecipe, role: str, t: Tensor, fp8_meta: dict[str, Any],
                  slot: tuple[str, int] | None = None) -> dict[str, Tensor]:
    """:func:`~precsearch.fp8.formats.quantization_stats` of ``t`` against the scale TE casts it with.

    Values stay on the device (no host sync). For delayed scaling ``scale`` is a
    copy of TE's scale, taken now (TE updates its own in place later); ``slot``
    overrides the role's ``(state key, slot)`` for modules with more GEMMs (``LayerNormMLP``).

    Raises:
        KeyError: Delayed scaling before TE created the layer's scaling state
            (call only after the layer's first FP8 forward).
    """
    if recipe_for(recipe.precision).history:  # TE's scale, from its amax history
        key, index = slot or _DELAYED_SLOT[role]
        scale = fp8_meta[key].scale[index].detach().clone()
        stats = quantization_stats(t, scale, role_format(recipe.fp8_format, role))
        stats["scale"] = scale
        return stats
    scaler = make_scaler(recipe, role)  # current/block/MX scales depend on this tensor alone
    scaler.quantize(t)
    return scaler.last_stats or {}  # a new scaler always tracks statistics
