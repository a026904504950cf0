"""AdamW with FP8 moments, fused: TE ``FusedAdam``'s FP8 numbers without its FP32 round trip, and a block-scaled FP8.

Why it exists. TE 2.20's ``FusedAdam`` keeps an FP8 moment (``exp_avg_dtype=torch.uint8``) as E4M3 with one
FP32 scale per tensor, and its ``step()`` turns each such moment into a new FP32 tensor, runs its Adam kernel
on the copies, then computes each copy's amax and quantizes it back, launched from Python tensor by tensor.
On the H200 that took FP8's speed-up from 1.27x to 0.99x at the 8B width (``docs/memory.md``), which is why
no configuration saved >= 35% at >= 1.2x. This optimizer runs the same update with the same storage:

* **moments**: each ``fp32``, ``bf16``, ``fp8`` or ``fp8_block``. An ``fp8`` moment is TE's: E4M3
  (``torch.float8_e4m3fn``) times a per-tensor FP32 ``scale_inv``, re-quantized after each step with TE's scale,
  ``scale_inv = amax / 448`` of the new FP32 moment (``FusedAdam._apply_scale``), rounded to nearest,
  saturating. A moment that is all zeros keeps ``scale_inv = 1`` (TE divides by its zero amax there, and the
  NaN reaches the weights: ``docs/memory.md``), and so does one whose amax is below :data:`MIN_AMAX`, which is
  then stored as zeros (see "Tiny moments" below).
* ``fp8_block`` is precsearch's own: E4M3 with one scale per 128 consecutive elements (the same rule per
  block), and the second moment stored as its square root. One per-tensor scale cannot hold a second moment:
  ``v`` spans the square of the gradients' range, E4M3 keeps about 2^17 of range below the amax, so the ``v``
  of every element whose gradient is 1/480 of the tensor's largest reads back 0 and its next update is
  ``m / eps``; on the 8B probe every ``fp8`` trial diverged by step 4 (H200, 2026-12-04). A block's scale follows
  the local magnitude (an embedding row, a slice of a weight row) and the root halves the span.
* **master weights** (``master``): ``none`` (the parameter, FP32 or BF16, is updated through FP32),
  ``fp32`` (a whole FP32 copy beside a BF16 parameter) or ``remainders`` (TE's ``store_param_remainders``:
  the BF16 parameter is the high 16 bits of the FP32 master, rounded to nearest by TE's rule, and an int16
  tensor keeps the low 16 bits). With FP32 parameters there is no master: they are their own.
* **the update**: TE's ``adam_w_mode`` kernel, in FP32: ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
  ``w -= lr (m/bc1 / (sqrt(v/bc2) + eps) + wd w)`` with ``bc = 1 - b^step``; the weights are updated from the
  FP32 moments, which are then stored.

**Tiny moments.** A parameter whose gradient stops (an embedding row of a token the data no longer holds)
keeps a first moment that shrinks by ``beta1`` a step, and its scale follows it down: 0.9^700 takes 1e-4 to
1e-36. Below ``448 * FLT_MIN`` (5.3e-36) ``amax / 448`` is no longer a normal FP32 number (a GPU flushes it to
0) and below 1.3e-36 ``1 / (amax / 448)`` overflows to inf; the block's zero codes then become ``0 * inf =
NaN``, and the NaN reaches the weight. That was the NaN of an FP32 master with ``fp8_block`` moments after
900-1,700 steps on an H100 (issue 54); it was the arithmetic, so the eager path and the kernels both had it,
and every master kind can reach it. A moment (or block) whose amax is below :data:`MIN_AMAX` is therefore
stored as zeros with ``scale_inv = 1``: what it loses is below 5.3e-36, less than ``eps`` by 27 orders.

On a CUDA device two Triton kernels per parameter do it (:mod:`precsearch.backends.fp8_state_kernels`):
one pass computes the new moments in registers for their amax, a second computes them again and writes
everything. No FP32 copy of a moment exists at any time, so the step adds no memory (FusedAdam's held one
group's copies), and it reads each state twice and writes it once. Elsewhere (a CPU, or a GPU without
Triton) :func:`reference_update` runs the same arithmetic in eager PyTorch; it is also what the GPU test
compares the kernels with, and the CPU tests check it against ``torch.optim.AdamW`` (FP32 states) and
against TE's storage rules (FP8 scales, remainder bits).

What it is not: Megatron-Core's ``--exp-avg-dtype fp8`` runs TE's ``FusedAdam`` (the slow path above) on the
same numbers; the export says so. It has no fp16 master and no FP8 (``te.quantized_model_init``)
parameters: :func:`applies` says when the ``te`` backend uses it instead of ``FusedAdam``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from precsearch.fp8.formats import fp8_max, smallest_scalable_amax
from precsearch.policy.rules import MemoryKnobs
from precsearch.storage import BF16, BLOCK_FP8, FP32, SCALED_FP8, TENSOR_FP8

#: Storage of one moment, by the knob's names, and the code the kernels take.
STATE_DTYPES: dict[str, torch.dtype] = {FP32: torch.float32, BF16: torch.bfloat16, TENSOR_FP8: torch.float8_e4m3fn,
                                        BLOCK_FP8: torch.float8_e4m3fn}
KIND_CODES: dict[str, int] = {FP32: 0, BF16: 1, TENSOR_FP8: 2, BLOCK_FP8: 3}
#: Consecutive elements (of the flattened tensor) sharing one ``fp8_block`` scale.
QBLOCK = 128
#: How master weights are kept, and the code the kernels take.
MASTER_CODES: dict[str, int] = {"none": 0, "fp32": 1, "remainders": 2}
MOMENTS = ("exp_avg", "exp_avg_sq")
#: The smallest amax a moment, or an ``fp8_block`` block, is scaled from (448 * FLT_MIN, 5.3e-36): below it the
#: moment is stored as zeros with scale 1 (the kernels read the same value).
MIN_AMAX = smallest_scalable_amax("e4m3")


def applies(first: str, second: str, master: str, fp8_weights: bool) -> bool:
    """Whether the ``te`` backend runs this optimizer (not ``FusedAdam``) for these knobs.

    Args:
        first: The first moment's dtype (``fp32``, ``bf16``, ``fp8`` or ``fp8_block``).
        second: The second moment's.
        master: ``none``, ``fp32``, ``fp16`` or ``remainders``.
        fp8_weights: Whether FP8 layers keep their weights in FP8 only (TE's FP8-parameter kernel).

    Returns:
        True when a moment is FP8 (either kind), the master is not FP16 and the weights are not FP8
        (:func:`~precsearch.backends.te_knobs.te_memory_knob_problem` refuses ``fp8_block`` there).
    """
    return bool(set(SCALED_FP8) & {first, second}) and master in MASTER_CODES and not fp8_weights


def param_dtype_name(params: Iterable[torch.Tensor]) -> str:
    """``fp32`` or ``bf16``: the dtype ``param`` moments follow, the first floating-point parameter's (as the
    ``te`` backend reads it); ``fp32`` where there is none."""
    first = next((p.dtype for p in params if p.dtype.is_floating_point), torch.float32)
    return "fp32" if first == torch.float32 else "bf16"


def keeps(knobs: MemoryKnobs, params: Iterable[torch.Tensor]) -> bool:
    """Whether this optimizer keeps ``knobs``' optimizer state for ``params`` (:func:`applies`)."""
    first, second = knobs.moment_dtypes(param_dtype_name(params))
    return applies(first, second, knobs.master, knobs.fp8_weights)


def for_knobs(params: Iterable[nn.Parameter], knobs: MemoryKnobs, *, lr: float, betas: tuple[float, float],
              weight_decay: float) -> "FP8StateAdamW | None":
    """This optimizer over ``params`` keeping ``knobs``' optimizer state, or None where it does not
    (:func:`keeps`: no FP8 moment, an FP16 master or FP8 weights). Runs on any device (eager off CUDA)."""
    params = list(params)
    if not keeps(knobs, params):
        return None
    first, second = knobs.moment_dtypes(param_dtype_name(params))
    return FP8StateAdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, master=knobs.master,
                         exp_avg_dtype=first, exp_avg_sq_dtype=second)


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """TE's scale for a moment whose new amax is ``amax``: ``1 / (amax / 448)``, and 1 where amax is below
    :data:`MIN_AMAX` (0 included), where every value then rounds to an E4M3 zero.

    The stored values are ``x * scale`` in E4M3 and ``scale_inv = 1 / scale``, as the kernels compute them.
    """
    return torch.where(amax >= MIN_AMAX, 1.0 / (amax / fp8_max("e4m3")), torch.ones_like(amax))


def as_blocks(x: torch.Tensor) -> torch.Tensor:
    """``x`` flattened and zero-padded to whole ``QBLOCK`` rows: shape (blocks, QBLOCK)."""
    flat = x.reshape(-1)
    pad = -flat.numel() % QBLOCK
    return torch.nn.functional.pad(flat, (0, pad)).reshape(-1, QBLOCK)


def quantize_state(x: torch.Tensor, storage: str, root: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` (FP32) kept in ``storage``: the tensor and, for FP8, its ``scale_inv``.

    ``fp8``: one scale (a 1-element FP32 tensor). ``fp8_block``: one scale per ``QBLOCK`` elements of the
    flattened tensor, and with ``root`` (the second moment) the square root of ``x`` is what is stored.
    """
    if storage == BLOCK_FP8:
        kept = as_blocks(x.sqrt() if root else x)
        scale = fp8_scale(kept.abs().amax(dim=1))
        codes = (kept * scale[:, None]).to(torch.float8_e4m3fn).reshape(-1)[:x.numel()].reshape(x.shape)
        return codes, 1.0 / scale
    if storage != "fp8":
        return x.to(STATE_DTYPES[storage]), None
    amax = x.abs().max().reshape(1) if x.numel() else torch.zeros(1, device=x.device)
    scale = fp8_scale(amax.float())
    return (x * scale).to(torch.float8_e4m3fn), 1.0 / scale


def dequantize_state(x: torch.Tensor, scale_inv: torch.Tensor | None, storage: str = "fp8",
                     root: bool = False) -> torch.Tensor:
    """A stored moment as FP32 (``storage`` and ``root`` as :func:`quantize_state` was given them)."""
    if scale_inv is None:
        return x.float()
    if storage != BLOCK_FP8:
        return x.float() * scale_inv
    values = (as_blocks(x.float()) * scale_inv[:, None]).reshape(-1)[:x.numel()].reshape(x.shape)
    return values * values if root else values


def split_master(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP32 master as TE's (BF16 parameter, int16 remainder): high 16 bits rounded by TE's rule, low 16."""
    bits = w.contiguous().view(torch.int32)
    low = (bits & 0xFFFF).to(torch.int16)
    high = ((bits >> 16) + (low < 0).to(torch.int32)).to(torch.int16)
    return high.view(torch.bfloat16), low


def join_master(param: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """The FP32 master that a BF16 parameter and its int16 remainder keep (inverse of :func:`split_master`)."""
    high = param.contiguous().view(torch.int16).to(torch.int32) - (remainder < 0).to(torch.int32)
    return ((high << 16) | (remainder.to(torch.int32) & 0xFFFF)).view(torch.float32)


def reference_update(p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], storage: dict[str, str],
                     master: str, *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                     step: int) -> None:
    """One AdamW step of ``p`` in eager PyTorch, on the states the kernels keep (see the module docstring)."""
    g = grad.float()
    m = dequantize_state(state["exp_avg"], state.get("exp_avg_scale_inv"), storage["exp_avg"])
    v = dequantize_state(state["exp_avg_sq"], state.get("exp_avg_sq_scale_inv"), storage["exp_avg_sq"], root=True)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    if master == "fp32":
        w = state["master_param"]
    elif master == "remainders":
        w = join_master(p.data, state["param_remainders"])
    else:
        w = p.data.float()
    bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    w = w - lr * ((m / bc1) / ((v / bc2).sqrt() + eps) + weight_decay * w)
    if master == "fp32":
        state["master_param"].copy_(w)
        p.data.copy_(w)
    elif master == "remainders":
        high, low = split_master(w)
        p.data.copy_(high.view(p.shape))
        state["param_remainders"].copy_(low.view(p.shape))
    else:
        p.data.copy_(w)
    for name, x in zip(MOMENTS, (m, v)):
        stored, scale_inv = quantize_state(x, storage[name], root=name == "exp_avg_sq")
        state[name].copy_(stored)
        if scale_inv is not None:
            state[f"{name}_scale_inv"].copy_(scale_inv)


def _kernels() -> Any:
    """The Triton kernels module, or None where Triton does not import."""
    try:
        from precsearch.backends import fp8_state_kernels
    except ImportError as e:
        warnings.warn(f"FP8StateAdamW: Triton does not import ({e}); CUDA parameters step in eager PyTorch, "
                      "slower and with FP32 temporaries", stacklevel=3)
        return None
    return fp8_state_kernels


def _check_plain(p: torch.Tensor, index: int) -> None:
    """Refuse a tensor subclass (FSDP2's ``DTensor`` shards): the steps and scales read whole plain tensors."""
    if type(p) not in (nn.Parameter, torch.Tensor):
        raise ValueError(f"FP8StateAdamW: parameter {index} of its group is a {type(p).__name__}, not a plain "
                         "tensor; it steps whole plain tensors (fp8_block scales cover 128 consecutive elements, "
                         "the Triton kernels read the storage): not FSDP2's DTensor shards (torchtitan's data "
                         "parallelism)")


class FP8StateAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) with FP8, BF16 or FP32 moments and FP32, remainder or no master weights.

    The states are made when the optimizer is built (the memory a run holds from its first step), each
    moment zero in its storage, each master the parameter's value. Saved and loaded with their own dtypes
    (``torch.optim.Optimizer.load_state_dict`` would cast every state tensor to its parameter's dtype).

    Args:
        params: Parameters or param groups, as any ``torch.optim`` optimizer.
        lr, betas, eps, weight_decay: As ``torch.optim.AdamW``.
        master: ``none``, ``fp32`` or ``remainders`` (BF16 parameters only; FP32 parameters get none).
        exp_avg_dtype: The first moment's storage: ``fp32``, ``bf16`` or ``fp8``.
        exp_avg_sq_dtype: The second moment's.
        kernels: Step CUDA parameters with the Triton kernels (False: the eager path everywhere, to compare).

    Raises:
        ValueError: An unknown storage or master name, naming it and the valid ones; a parameter that is not a
            plain tensor (an FSDP2 ``DTensor`` shard).
    """

    def __init__(self, params: Iterable[nn.Parameter] | Iterable[dict], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, *,
                 master: str = "fp32", exp_avg_dtype: str = "fp8", exp_avg_sq_dtype: str = "fp8",
                 kernels: bool = True) -> None:
        for name, value, valid in (("master", master, MASTER_CODES), ("exp_avg_dtype", exp_avg_dtype, STATE_DTYPES),
                                   ("exp_avg_sq_dtype", exp_avg_sq_dtype, STATE_DTYPES)):
            if value not in valid:
                raise ValueError(f"{name} {value!r}; valid: {', '.join(valid)}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.master = master
        self.storage = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype}
        self.kernels = kernels
        for group in self.param_groups:
            for i, p in enumerate(group["params"]):
                _check_plain(p, i)
                self.state[p] = self._new_state(p)

    def master_of(self, p: torch.Tensor) -> str:
        """How ``p``'s master is kept: the optimizer's choice for BF16 parameters, ``none`` for others."""
        return self.master if p.dtype == torch.bfloat16 else "none"

    def _new_state(self, p: torch.Tensor) -> dict[str, Any]:
        state: dict[str, Any] = {"step": 0}
        for name in MOMENTS:
            state[name] = torch.zeros_like(p, dtype=STATE_DTYPES[self.storage[name]],
                                           memory_format=torch.contiguous_format)
            if self.storage[name] in SCALED_FP8:
                scales = -(-p.numel() // QBLOCK) if self.storage[name] == BLOCK_FP8 else 1
                state[f"{name}_scale_inv"] = torch.ones(scales, dtype=torch.float32, device=p.device)
        master = self.master_of(p)
        if master == "fp32":
            state["master_param"] = p.detach().float().contiguous()
        elif master == "remainders":
            state["param_remainders"] = torch.zeros_like(p, dtype=torch.int16, memory_format=torch.contiguous_format)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict``, keeping each state's saved dtype (FP8 moments, int16 remainders, FP32 master)."""
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict({**state_dict, "state": {}})  # the groups only: it would cast every state
        params = [p for g in self.param_groups for p in g["params"]]
        for index, p in zip(saved_ids, params):
            saved = state_dict["state"].get(index)
            self.state[p] = self._new_state(p) if saved is None else {
                k: v.to(device=p.device) if torch.is_tensor(v) else v for k, v in saved.items()}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One AdamW step over every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        kernels = None if self.kernels else False
        if any(p not in self.state for group in self.param_groups for p in group["params"]):
            self._adopt_swapped_params()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] += 1
                options = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                               weight_decay=group["weight_decay"], step=state["step"])
                if p.is_cuda and kernels is None:
                    kernels = _kernels() or False
                if p.is_cuda and kernels and p.is_contiguous():
                    self._fused_update(kernels, p, state, **options)
                else:
                    reference_update(p, p.grad, state, self.storage, self.master_of(p), **options)
        return loss

    def _adopt_swapped_params(self) -> None:
        """States for parameters put into the groups after the optimizer was built, the replaced ones' dropped.

        Accelerate's Transformer Engine path (``Accelerator._prepare_te``, accelerate 1.16) converts the model in
        ``prepare()`` to ``te.Linear`` layers holding copies of the weights, and points ``param_groups`` at them
        without re-keying ``state``; the states made here at build time would then belong to parameters no
        longer trained. Before the first step (where ``prepare()`` runs) the new states equal the dropped ones:
        zero moments, the master the weight's value.
        """
        current = [p for group in self.param_groups for p in group["params"]]
        kept = set(current)
        for stale in [p for p in self.state if p not in kept]:
            del self.state[stale]
        for i, p in enumerate(current):
            if p not in self.state:
                _check_plain(p, i)
                self.state[p] = self._new_state(p)

    def _fused_update(self, kernels: Any, p: torch.Tensor, state: dict[str, Any], *, lr: float, beta1: float,
                      beta2: float, eps: float, weight_decay: float, step: int) -> None:
        """Both Triton passes over ``p``; then each FP8 moment's new ``scale_inv`` swapped in."""
        master = self.master_of(p)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
        amax = torch.zeros(2, dtype=torch.float32, device=p.device)
        unused = amax  # the pointer passed for a scale the moment's storage has not (the kernels never read it)
        m_sinv = state.get("exp_avg_scale_inv", unused)
        v_sinv = state.get("exp_avg_sq_scale_inv", unused)
        new_m_sinv = torch.empty_like(m_sinv) if self.storage["exp_avg"] == "fp8" else unused
        new_v_sinv = torch.empty_like(v_sinv) if self.storage["exp_avg_sq"] == "fp8" else unused
        weights = p.data.view(torch.int16) if master == "remainders" else p.data
        master_t = state.get("master_param", weights)
        rem = state.get("param_remainders", weights)
        n = p.numel()
        codes = {"m_kind": KIND_CODES[self.storage["exp_avg"]], "v_kind": KIND_CODES[self.storage["exp_avg_sq"]]}
        kernels.launch(n, (grad, m, v, m_sinv, v_sinv, amax, n, beta1, beta2),
                       (weights, grad, master_t, rem, m, v, m_sinv, v_sinv, amax, new_m_sinv, new_v_sinv, n,
                        lr, beta1, beta2, eps, weight_decay, 1.0 - beta1 ** step, 1.0 - beta2 ** step),
                       master=MASTER_CODES[master], qblock=QBLOCK, **codes)
        if self.storage["exp_avg"] == "fp8":  # per-block scales are written in place
            state["exp_avg_scale_inv"] = new_m_sinv
        if self.storage["exp_avg_sq"] == "fp8":
            state["exp_avg_sq_scale_inv"] = new_v_sinv
