"""Transformer Engine's ``FusedAdam`` with the memory knobs a search can vary.

Split from :mod:`precsearch.backends.te` (the layers); :meth:`TEBackend.build_optimizer`
uses these for non-default :class:`~precsearch.policy.MemoryKnobs`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from precsearch.backends.capability import require_te

#: Optimizer-state dtypes FusedAdam accepts, by the names a space file may use.
OPTIMIZER_STATE_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.uint8,  # FusedAdam's spelling of an FP8 (E4M3, scaled) state
}



def _state_dtype(value: torch.dtype | str) -> torch.dtype:
    """A FusedAdam state dtype from a dtype or one of :data:`OPTIMIZER_STATE_DTYPES`' names."""
    if isinstance(value, torch.dtype):
        return value
    try:
        return OPTIMIZER_STATE_DTYPES[value]
    except KeyError:
        raise ValueError(
            f"unknown optimizer state dtype {value!r}; valid: {', '.join(OPTIMIZER_STATE_DTYPES)}"
        ) from None


def build_optimizer(
    params: Iterable[nn.Parameter] | Iterable[dict],
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    *,
    master_weights: bool = False,
    exp_avg_dtype: torch.dtype | str = torch.float32,
    exp_avg_sq_dtype: torch.dtype | str = torch.float32,
    eps: float = 1e-8,
) -> torch.optim.Optimizer:
    """TE's ``FusedAdam`` in AdamW mode, with the memory knobs a search can vary.

    Signature verified in ``transformer_engine/pytorch/optimizers/fused_adam.py``
    (TE 2.20.2): ``FusedAdam(params, lr, betas, eps, weight_decay, amsgrad=False,
    *, bias_correction=True, adam_w_mode=True, capturable=False,
    master_weights=False, master_weight_dtype=torch.float32,
    exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32,
    use_decoupled_grad=False, store_param_remainders=False)``. ``adam_w_mode``
    is decoupled weight decay, as ``torch.optim.AdamW``.

    Notes:
        * ``master_weights`` keeps FP32 copies for BF16/FP16/FP8 parameters.
          FP32 parameters are updated in place whatever this flag says (FusedAdam
          would only allocate unused copies for them), so it matters with BF16
          parameters (``probe.param_dtype: bf16``) and with
          ``TEBackend(fp8_weights=True)``, where it is required.
        * ``exp_avg_dtype``/``exp_avg_sq_dtype``: fp32, bf16, fp16 or fp8
          (``torch.uint8``); non-fp32 states get a per-tensor FP32 scale.
        * GPU only (FusedAdam allocates on ``cuda``).

    Raises:
        BackendUnavailable: Transformer Engine does not import.
        ValueError: An unknown state dtype name.
    """
    require_te()
    from transformer_engine.pytorch.optimizers import FusedAdam

    return FusedAdam(
        params,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        adam_w_mode=True,
        master_weights=master_weights,
        master_weight_dtype=torch.float32,
        exp_avg_dtype=_state_dtype(exp_avg_dtype),
        exp_avg_sq_dtype=_state_dtype(exp_avg_sq_dtype),
    )


def seed_master_weights(optimizer: torch.optim.Optimizer) -> int:
    """Start FusedAdam's FP32 master weights from the values FP8 weights were quantized from.

    For each parameter that ``te.quantized_model_init(preserve_high_precision_init_val=True)``
    gave a ``get_high_precision_init_val`` method: initialise its optimizer state
    (``FusedAdam.initialize_state``), overwrite the master copy with the kept
    high-precision values (``FusedAdam.set_scaled_state``) and free the CPU copy.

    Returns:
        How many parameters were seeded.
    """
    seeded = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            getter = getattr(p, "get_high_precision_init_val", None)
            value = getter() if getter is not None else None
            if value is None:
                continue
            if not optimizer.state[p]:
                optimizer.initialize_state(p, False)
            optimizer.set_scaled_state(p, "master_param", value.to(device=p.device, dtype=torch.float32))
            p.clear_high_precision_init_val()
            seeded += 1
    return seeded
