"""The optimizer step at a fixed state, as the baseline takes it and as a policy's memory knobs take it.

The baseline (BF16 compute, FP32 master weights and AdamW moments) applies the
AdamW update exactly. A policy's memory knobs change two things about the step:

* **stored moments** (``moment_dtype`` / ``exp_avg_dtype`` / ``exp_avg_sq_dtype``
  BF16 or FP8): the moments the step starts from are the state's rounded to that
  storage (FP8: E4M3 with a per-tensor scale, as TE's ``FusedAdam`` keeps them;
  ``fp8_block``: E4M3 with a scale per 128 elements, the second moment as its square
  root, as ``backends.fp8_state_adam`` keeps them), so the update is computed from
  rounded averages;
* **where the update lands**: with FP32 master weights (or TE's param
  remainders, the same FP32 values in two tensors) every update is kept. Without
  a master copy the update is added to the parameter in its own dtype and the
  part below its rounding quantum is lost (BF16 parameters: 8 significant bits);
  an FP16 master keeps it to FP16's quantum under a per-tensor scale.

:func:`applied_update` returns the change a step makes to the master value the
next forward reads from; its difference from :func:`baseline_update` on the same
gradient is the update error the knobs cause.

The reading computes them a chunk of a unit at a time, for all K batches at once
(:class:`UnitStep`): everything is elementwise but the per-tensor scales (FP8
moments, an FP16 master), each taken from the amax of the whole tensor, which is
the max over its chunks exactly, so a chunk's values are the whole tensor's to
the bit (:class:`Storage`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from precsearch.backends.fp8_state_adam import dequantize_state, quantize_state
from precsearch.storage import BF16, BLOCK_FP8, FP32
from precsearch.fp8.formats import fp8_max, quantize_dequantize
from precsearch.probe.damage.rounding import round_to_bf16, round_to_fp16
from precsearch.policy import MemoryKnobs


#: Storage dtypes kept with a per-tensor scale (taken from the amax of the whole tensor).
SCALED = ("fp16", "fp8")
STORAGE_DTYPES = (FP32, BF16, *SCALED, BLOCK_FP8)


class Storage:
    """How values are kept in ``dtype`` storage (``fp32``, ``bf16``, ``fp16`` with a per-tensor scale, ``fp8``).

    A scaled storage (:data:`SCALED`) takes its scale from ``amax``, the largest magnitude of the whole tensor it
    keeps (the max over a tensor's chunks is that max exactly), so applied to each chunk of the tensor in turn it
    gives the whole tensor's stored values to the bit; ``amax`` may also hold one value per row (shaped to
    broadcast, e.g. ``(K, 1)``), a storage per row. ``fp32`` and ``bf16`` are elementwise and take no ``amax``;
    ``fp8_block`` takes its scales from each block of ``fp8_state_adam.QBLOCK`` elements of the flattened values
    (no ``amax``): a chunk that starts at a multiple of it (the reading's chunks are powers of two) holds whole
    blocks, so it is stored as the whole tensor is; ``root`` says it keeps the square root of the values (the
    second moment's).
    """

    def __init__(self, dtype: str, amax: Tensor | None = None, root: bool = False):
        if dtype not in STORAGE_DTYPES:
            raise ValueError(f"unknown storage dtype {dtype!r}; valid: {', '.join(STORAGE_DTYPES)}")
        if (dtype in SCALED) != (amax is not None):
            raise ValueError(f"{dtype} storage {'needs' if dtype in SCALED else 'takes no'} amax")
        self.dtype, self.amax, self.scale, self.root = dtype, amax, None, root
        if amax is not None:
            clamped = amax.clamp(min=torch.finfo(torch.float32).tiny)
            if dtype == "fp16":  # scaled into FP16's range, as TE's FP16 master copies are
                scale = torch.finfo(torch.float16).max / 2 / clamped
            else:
                scale = fp8_max("e4m3") / clamped
            # finite even for a tensor of zeros (moments before the first step): an infinite scale would read
            # 0 * inf = NaN, where the stored zeros are zeros
            self.scale = scale.clamp(max=torch.finfo(torch.float32).max)

    @classmethod
    def of(cls, x: Tensor, dtype: str) -> "Storage":
        """The storage of the whole tensor ``x`` in ``dtype``."""
        return cls(dtype, x.abs().max() if dtype in SCALED else None)

    def __call__(self, x: Tensor) -> Tensor:
        """``x`` (the whole tensor, or a chunk of it) as kept in this storage, as float32. BF16 and FP16 round by
        integer arithmetic on the bits (:mod:`.rounding`: the cast's values, which a compiler cannot fold)."""
        if self.dtype == "fp32":
            return x
        if self.dtype == "bf16":
            return round_to_bf16(x)
        if self.dtype == "fp16":
            return round_to_fp16(x * self.scale) / self.scale
        if self.dtype == BLOCK_FP8:
            # the optimizer's own rounding (backends.fp8_state_adam), so the reading sees its stored values
            return dequantize_state(*quantize_state(x, BLOCK_FP8, root=self.root), BLOCK_FP8, root=self.root)
        return quantize_dequantize(x, self.scale, "e4m3", amax=self.amax)


def stored(x: Tensor, dtype: str) -> Tensor:
    """``x`` as kept in ``dtype`` storage (``fp32``, ``bf16``, ``fp16`` with a per-tensor scale, ``fp8``)."""
    return Storage.of(x, dtype)(x)


def adam_update(weight: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: int, lr: float,
                betas: tuple[float, float], weight_decay: float, eps: float = 1e-8) -> Tensor:
    """The change AdamW (decoupled weight decay, bias-corrected) makes to ``weight`` at 0-based ``step``."""
    b1, b2 = betas
    t = step + 1
    m = b1 * exp_avg + (1 - b1) * grad
    v = b2 * exp_avg_sq + (1 - b2) * grad * grad
    denom = (v / (1 - b2**t)).sqrt() + eps
    return -lr * (m / (1 - b1**t) / denom + weight_decay * weight)


def baseline_update(weight: Tensor, grad: Tensor, moments: tuple[Tensor, Tensor], step: int, lr: float,
                    betas: tuple[float, float], weight_decay: float) -> Tensor:
    """The baseline's exact update (FP32 master weights and moments)."""
    return adam_update(weight, grad.float(), *moments, step, lr, betas, weight_decay)


def applied_update(weight: Tensor, grad: Tensor, moments: tuple[Tensor, Tensor], step: int, lr: float,
                   betas: tuple[float, float], weight_decay: float, knobs: MemoryKnobs, param_dtype: str) -> Tensor:
    """The change the policy's step makes to the value it keeps for ``weight`` (see the module docstring)."""
    dtypes = StepDtypes.of(knobs, param_dtype)
    w, g = weight.reshape(-1), grad.float().reshape(-1)  # the whole tensor as one chunk of itself
    m = (moments[0].reshape(-1), moments[1].reshape(-1))
    amax = {name: x.abs().max() for name, x in (("weight", w), *zip(MOMENTS, m)) if name in dtypes.scaled()}
    unit = UnitStep(dtypes, (step, lr, betas, weight_decay), amax)
    return unit.applied(w, g, m, unit.landed_storage(w, g, m)).reshape(weight.shape)


#: The names of a unit's two AdamW moments, in order.
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class StepDtypes:
    """The storages a policy's step uses: each moment's (``fp32``, ``bf16``, ``fp8``, ``fp8_block``) and ``keep``,
    the dtype the updates accumulate in (``fp32``, ``bf16``, ``fp16``: :func:`_master_storage`)."""

    exp_avg: str
    exp_avg_sq: str
    keep: str

    @classmethod
    def of(cls, knobs: MemoryKnobs, param_dtype: str) -> "StepDtypes":
        first, second = knobs.moment_dtypes(param_dtype)
        return cls(first, second, _master_storage(knobs, param_dtype))

    def scaled(self) -> tuple[str, ...]:
        """Which of ``weight`` (kept in ``keep``), ``exp_avg``, ``exp_avg_sq`` are stored with a per-tensor scale:
        the amax of each whole tensor is needed before any chunk of it is stored."""
        return tuple(name for name, dtype in (("weight", self.keep), ("exp_avg", self.exp_avg),
                                             ("exp_avg_sq", self.exp_avg_sq)) if dtype in SCALED)


class UnitStep:
    """One unit's step at a fixed state, the baseline's and a policy's, computed a chunk at a time.

    What does not depend on the batch is fixed once per unit: the storages of the two moments and of the kept
    weight (``before``), each scaled storage's scale from ``amax``, the whole tensor's amax by name (``weight``,
    ``exp_avg``, ``exp_avg_sq``; only those :meth:`StepDtypes.scaled` names). Every method then takes the same
    slice of the flattened weight ``w``, moments ``m`` and gradients (one row per batch: K x chunk, float32,
    against a chunk of ``w`` and ``m``) and is elementwise, so a chunk's values are the whole unit's there, to
    the bit, and each chunk's stored moments and ``before`` are computed once for all K batches.

    A scaled ``keep`` (an FP16 master) also rounds ``before + update`` with the amax of the whole sum, one per
    batch: :meth:`landed_amax` gives a chunk's (the max over the unit's chunks is the whole sum's, exactly),
    :meth:`landed_storage` the storage made from it, which :meth:`applied` then takes.
    """

    def __init__(self, dtypes: StepDtypes, args: tuple[int, float, tuple[float, float], float],
                 amax: dict[str, Tensor] | None = None):
        amax = amax or {}
        missing = set(dtypes.scaled()) - set(amax)
        if missing:
            raise ValueError(f"a per-tensor scale needs the amax of {', '.join(sorted(missing))}")
        self.dtypes, self.args = dtypes, args
        self.exp_avg = Storage(dtypes.exp_avg, amax.get("exp_avg") if dtypes.exp_avg in SCALED else None)
        self.exp_avg_sq = Storage(dtypes.exp_avg_sq, amax.get("exp_avg_sq") if dtypes.exp_avg_sq in SCALED else None,
                                  root=True)
        self.keep = Storage(dtypes.keep, amax.get("weight") if dtypes.keep in SCALED else None)

    def baseline(self, w: Tensor, g: Tensor, m: tuple[Tensor, Tensor]) -> Tensor:
        """The baseline's exact update from gradient rows ``g`` (:func:`baseline_update`)."""
        return adam_update(w, g, m[0], m[1], *self.args)

    def update(self, w: Tensor, p: Tensor, m: tuple[Tensor, Tensor]) -> Tensor:
        """The policy's AdamW update from gradient rows ``p``, computed from its stored moments."""
        return adam_update(w, p, self.exp_avg(m[0]), self.exp_avg_sq(m[1]), *self.args)

    def landed_amax(self, w: Tensor, p: Tensor, m: tuple[Tensor, Tensor]) -> Tensor:
        """Per row, the chunk's amax of ``before + update`` (keepdim: shaped ``p.shape[:-1] + (1,)``)."""
        return (self.keep(w) + self.update(w, p, m)).abs().amax(dim=-1, keepdim=True)

    def landed_storage(self, w: Tensor, p: Tensor, m: tuple[Tensor, Tensor]) -> Storage | None:
        """For a whole unit: the storage :meth:`applied` rounds ``before + update`` into (None: ``keep``'s own)."""
        return Storage(self.keep.dtype, self.landed_amax(w, p, m)) if self.keep.dtype in SCALED else None

    def applied(self, w: Tensor, p: Tensor, m: tuple[Tensor, Tensor], landed: Storage | None = None) -> Tensor:
        """The change the policy's step makes to the value it keeps (:func:`applied_update`); a scaled ``keep``
        needs ``landed``, the storage of the whole unit's ``before + update`` (:meth:`landed_storage`)."""
        update = self.update(w, p, m)
        if self.keep.dtype == "fp32":
            return update
        if landed is None:
            if self.keep.dtype in SCALED:
                raise ValueError(f"{self.keep.dtype} updates are rounded with the whole unit's amax: pass landed")
            landed = self.keep
        before = self.keep(w)
        return landed(before + update) - before


def _master_storage(knobs: MemoryKnobs, param_dtype: str) -> str:
    """The dtype the optimizer accumulates updates in: the master copy's, or the parameter's without one.

    ``fp32`` (FP32 master, TE's param remainders, FP8 weights' FP32 master, or FP32 parameters without a master),
    ``bf16`` (BF16 parameters without a master: ``probe.param_dtype`` is ``fp32`` or ``bf16``), or ``fp16`` (an
    FP16 master, per-tensor scaled).
    """
    master = knobs.master
    if master == "none":
        return param_dtype
    return "fp32" if master == "remainders" else master
