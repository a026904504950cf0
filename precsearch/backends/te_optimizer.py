"""Transformer Engine's ``FusedAdam`` with the memory knobs a search can vary.

Split from :mod:`precsearch.backends.te` (the layers); :meth:`TEBackend.build_optimizer`
uses these for non-default :class:`~precsearch.policy.MemoryKnobs`.

Why the parameters are split into several groups (:func:`size_bounded_groups`): TE 2.20's
``FusedAdam.step()`` dequantizes every *scaled* state of a param group (FP8 or FP16 moments,
FP16 master weights, and a BF16 moment whose partner is not BF16) into a new FP32 tensor,
runs the Adam kernel on those, then re-quantizes them, and it keeps the FP32 copies of the
whole group alive until the group is done. With all parameters in one group the step
therefore holds an FP32 copy of every scaled state at once: FP8 moments then cost 4 + 1 bytes
per element at the step's peak instead of 1, more than FP32 moments. Splitting the parameters
into groups no larger than the largest parameter bounds that temporary to one group's size
(measured: ``2026-11-30_h200_bench_memory_knobs_call1.json@43b5edd``, rows
``fp8_m_fp8_one`` and ``fp8_m_fp8``).

Why FP8 states are re-made (:func:`compact_fp8_states`): ``FusedAdam`` creates an FP8 state
with a ``Float8Quantizer`` left at its default usage (row-wise *and* column-wise), so on
Hopper every FP8 moment also allocates its transpose: 2 bytes per element, what a BF16
moment costs. The optimizer only ever reads the row-wise data (``.float()``) and writes it
back (``copy_``), so the states are initialised eagerly here and each FP8 one replaced by a
row-wise-only tensor: 1 byte per element.

Why FP8 weights get a hook after each step (:func:`refresh_fp8_weight_transposes`): with
``fp8_weights`` (``te.quantized_model_init``) a delayed-scaling weight is a ``Float8Tensor``
that ``FusedAdam``'s FP8 kernel updates in place, writing its row-wise data and ``scale_inv``
only. Its transpose, made at init, stays marked valid, and on Hopper the backward's data
gradient reads it: every step's dgrad GEMMs then used the initial weights. In the 2,000-step
soak that cost +39.9% held-out loss (bench_soak row ``std_fp32_fp32_fp8w``, H200, 2026-12-06).
The hook marks each such weight's caches stale, so the next forward quantizes its transpose
from the updated data, as TE's own Megatron path does after it casts master weights to FP8.
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
    master_weight_dtype: torch.dtype | str = torch.float32,
    store_param_remainders: bool = False,
    exp_avg_dtype: torch.dtype | str = torch.float32,
    exp_avg_sq_dtype: torch.dtype | str = torch.float32,
    eps: float = 1e-8,
    split_groups: bool = True,
    compact_states: bool = True,
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
        * ``master_weight_dtype``: fp32 or fp16 (FP16 with a per-tensor FP32 scale).
        * ``store_param_remainders``: with BF16 parameters and FP32 master weights,
          keep only the 16 low bits of each FP32 master (the high 16 are the BF16
          parameter): 2 bytes per element instead of 4, same values.
        * ``split_groups``: pass :func:`size_bounded_groups` instead of one group.
        * ``compact_states``: initialise the states now, FP8 ones row-wise only
          (:func:`compact_fp8_states`); False leaves FusedAdam's lazy, two-layout states.
        * GPU only (FusedAdam allocates on ``cuda``).

    Raises:
        BackendUnavailable: Transformer Engine does not import.
        ValueError: An unknown state dtype name.
    """
    require_te()
    from transformer_engine.pytorch.optimizers import FusedAdam

    groups = size_bounded_groups(params) if split_groups else params
    remainders = store_param_remainders and master_weights and _state_dtype(master_weight_dtype) == torch.float32
    opt = FusedAdam(
        groups,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        adam_w_mode=True,
        master_weights=master_weights,
        master_weight_dtype=_state_dtype(master_weight_dtype),
        exp_avg_dtype=_state_dtype(exp_avg_dtype),
        exp_avg_sq_dtype=_state_dtype(exp_avg_sq_dtype),
        store_param_remainders=remainders,
    )
    if compact_states:
        compact_fp8_states(opt)
    if any(is_delayed_fp8_weight(p) for group in opt.param_groups for p in group["params"]):
        opt.register_step_post_hook(refresh_fp8_weight_transposes)
    return opt


def is_delayed_fp8_weight(p: torch.Tensor) -> bool:
    """Whether ``p`` is a delayed-scaling ``Float8Tensor`` parameter (``te.quantized_model_init``): the kind
    ``FusedAdam`` updates in place with its FP8 kernel."""
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer, Float8Tensor

    return isinstance(p, Float8Tensor) and isinstance(p._quantizer, Float8Quantizer)


def refresh_fp8_weight_transposes(optimizer: torch.optim.Optimizer, *_: object) -> None:
    """A step post-hook: mark every FP8 weight's cached transpose stale (see the module docstring), so the next
    forward re-quantizes it from the row-wise data the step wrote."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if is_delayed_fp8_weight(p):
                p._reset_caches()


def compact_fp8_states(optimizer: torch.optim.Optimizer) -> int:
    """Initialise every state of ``optimizer`` now; keep its FP8 states row-wise only (no transpose).

    Values are kept: a state holding moments (after ``load_state_dict``, which re-makes
    them with both layouts) is re-quantized with FusedAdam's own per-tensor scaling; an
    all-zero one (a fresh state) with scale 1, as FusedAdam initialises it. A FusedAdam
    without FP8 states has its states initialised only; a no-op for ``torch.optim.AdamW``.

    Returns:
        How many FP8 states were re-made.
    """
    if not hasattr(optimizer, "initialize_state"):  # torch.optim.AdamW: nothing to initialise or re-make
        return 0
    names = [n for n in ("exp_avg", "exp_avg_sq")
             if getattr(optimizer, "name_to_dtype_map", {}).get(n) == torch.uint8]
    if names:
        from transformer_engine.pytorch.constants import DType
        from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer
    remade = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                optimizer.initialize_state(p, optimizer.store_param_remainders and p.dtype == torch.bfloat16)
            for name in names:
                values = state[name].float()
                state[name] = None  # free the two-layout tensor before the one-layout one is made
                quantizer = Float8Quantizer(scale=torch.ones(1, dtype=torch.float32, device=p.device),
                                            amax=torch.zeros(1, dtype=torch.float32, device=p.device),
                                            fp8_dtype=DType.kFloat8E4M3, rowwise=True, columnwise=False)
                if bool(values.abs().max() > 0):
                    state[name] = quantizer.make_empty(p.shape, device=p.device)
                    optimizer._apply_scale(name, values, state[name], optimizer._scales[p][name])
                else:
                    state[name] = quantizer.quantize(values)
                remade += 1
    return remade


def size_bounded_groups(params: Iterable[nn.Parameter] | Iterable[dict]) -> list[dict]:
    """Parameters packed, in order, into groups of at most the largest parameter's element count.

    Each group keeps the options of the group it came from (plain parameters form one group
    without options). Adam's update is element-wise, so the split changes no value; it bounds
    the FP32 temporaries ``FusedAdam.step()`` holds per group (see the module docstring).
    """
    given = list(params)
    sources = given if given and isinstance(given[0], dict) else [{"params": given}]
    sources = [{**g, "params": list(g["params"])} for g in sources]
    limit = max((p.numel() for g in sources for p in g["params"]), default=0)
    groups: list[dict] = []
    for source in sources:
        options = {k: v for k, v in source.items() if k != "params"}
        current: list[nn.Parameter] = []
        size = 0
        for p in source["params"]:
            if current and size + p.numel() > limit:
                groups.append({**options, "params": current})
                current, size = [], 0
            current.append(p)
            size += p.numel()
        if current:
            groups.append({**options, "params": current})
    return groups


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
