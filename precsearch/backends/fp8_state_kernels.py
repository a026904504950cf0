"""Triton kernels of :class:`~precsearch.backends.fp8_state_adam.FP8StateAdamW`'s step, one parameter at a time.

Imported only on a CUDA device (Triton ships with PyTorch's CUDA builds). The arithmetic, storages and
rounding are those of :mod:`precsearch.backends.fp8_state_adam`'s module docstring; its ``reference_update`` is
the same update in eager PyTorch, which the GPU test compares these kernels with.

A program takes ``GROUPS`` x ``QBLOCK`` consecutive elements (a 2-D tile, one row per ``fp8_block`` scale).
Storage codes: 0 FP32, 1 BF16, 2 FP8 E4M3 with one per-tensor scale (TE's), 3 FP8 E4M3 with one scale per
``QBLOCK`` elements (the second moment kept as its square root).

* With a per-tensor FP8 moment, :func:`amax_kernel` first computes the new moments in registers and folds their
  amax into ``amax`` (atomic max over the programs); the update needs the whole tensor's amax before it can
  quantize.
* :func:`update_kernel` computes the new moments (again, from the same inputs with the same code: the same
  values), updates the weights from the FP32 moments, and stores each moment: a per-block one with its tile
  row's own amax, so one pass suffices; a per-tensor one with pass 1's amax, program 0 writing the new
  ``scale_inv`` beside the old one (``new_*_scale_inv``: every program still reads the old one), which the
  caller swaps in after the launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from precsearch.fp8.formats import smallest_scalable_amax

#: Tile rows per program.
GROUPS = 8
#: Below it a moment (or block) is stored as zeros with scale 1 (``fp8_state_adam.MIN_AMAX``, "Tiny moments").
MIN_AMAX = tl.constexpr(smallest_scalable_amax("e4m3"))


@triton.jit
def _load_state(ptr, offs, mask, sinv_ptr, rows, row_mask, KIND: tl.constexpr, ROOT: tl.constexpr):
    """A moment as FP32 (a rooted per-block moment squared back)."""
    x = tl.load(ptr + offs, mask=mask).to(tl.float32)
    if KIND == 2:
        x = x * tl.load(sinv_ptr)
    if KIND == 3:
        x = x * tl.load(sinv_ptr + rows, mask=row_mask, other=1.0)[:, None]
        if ROOT:
            x = x * x
    return tl.where(mask, x, 0.0)


@triton.jit
def _tile(n, QBLOCK: tl.constexpr, GROUPS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    offs = rows[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    return rows, offs, offs < n, rows * QBLOCK < n


@triton.jit
def _moments(g_ptr, m_ptr, v_ptr, m_sinv_ptr, v_sinv_ptr, rows, offs, mask, row_mask, beta1, beta2,
             M_KIND: tl.constexpr, V_KIND: tl.constexpr):
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = _load_state(m_ptr, offs, mask, m_sinv_ptr, rows, row_mask, M_KIND, False)
    v = _load_state(v_ptr, offs, mask, v_sinv_ptr, rows, row_mask, V_KIND, True)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    return m, v


@triton.jit
def amax_kernel(g_ptr, m_ptr, v_ptr, m_sinv_ptr, v_sinv_ptr, amax_ptr, n, beta1, beta2,
                M_KIND: tl.constexpr, V_KIND: tl.constexpr, QBLOCK: tl.constexpr, GROUPS: tl.constexpr):
    """Pass 1: ``amax[0] = max |new m|`` (if m is per-tensor FP8), ``amax[1] = max new v`` (likewise)."""
    rows, offs, mask, row_mask = _tile(n, QBLOCK, GROUPS)
    m, v = _moments(g_ptr, m_ptr, v_ptr, m_sinv_ptr, v_sinv_ptr, rows, offs, mask, row_mask, beta1, beta2,
                    M_KIND, V_KIND)
    if M_KIND == 2:
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(m), axis=1), axis=0))
    if V_KIND == 2:
        tl.atomic_max(amax_ptr + 1, tl.max(tl.max(v, axis=1), axis=0))


@triton.jit
def _fp8_scale(amax):
    """TE's scale for ``amax`` (``FusedAdam._apply_scale``: scale_inv = amax / 448), 1 where amax is below
    ``MIN_AMAX`` (0 included): there ``1 / (amax / 448)`` would be inf, or ``amax / 448`` flushed to 0, and a
    zero code times inf NaN."""
    return tl.where(amax >= MIN_AMAX, tl.div_rn(1.0, tl.div_rn(amax, 448.0)), 1.0)


@triton.jit
def _store_state(ptr, offs, mask, x, amax_ptr, sinv_ptr, new_sinv_ptr, rows, row_mask, first,
                 KIND: tl.constexpr, ROOT: tl.constexpr):
    if KIND == 2:
        scale = _fp8_scale(tl.load(amax_ptr))
        tl.store(ptr + offs, (x * scale).to(tl.float8e4nv), mask=mask)
        tl.store(new_sinv_ptr, tl.div_rn(1.0, scale), mask=first)
    elif KIND == 3:
        if ROOT:
            x = tl.sqrt_rn(x)
        scale = _fp8_scale(tl.max(tl.abs(x), axis=1))
        tl.store(ptr + offs, (x * scale[:, None]).to(tl.float8e4nv), mask=mask)
        tl.store(sinv_ptr + rows, tl.div_rn(1.0, scale), mask=row_mask)
    else:
        tl.store(ptr + offs, x, mask=mask)


@triton.jit
def update_kernel(p_ptr, g_ptr, master_ptr, rem_ptr, m_ptr, v_ptr, m_sinv_ptr, v_sinv_ptr, amax_ptr,
                  new_m_sinv_ptr, new_v_sinv_ptr, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2,
                  MASTER: tl.constexpr, M_KIND: tl.constexpr, V_KIND: tl.constexpr, QBLOCK: tl.constexpr,
                  GROUPS: tl.constexpr):
    """The AdamW update (TE's ``adam_w_mode``) and the stores.

    MASTER 0: the parameter is its own master (FP32 or BF16, updated through FP32); 1: a whole FP32
    master; 2: TE's param remainders (``p_ptr`` the BF16 parameter viewed as int16, ``rem_ptr`` the low
    16 bits of the FP32 master).
    """
    rows, offs, mask, row_mask = _tile(n, QBLOCK, GROUPS)
    m, v = _moments(g_ptr, m_ptr, v_ptr, m_sinv_ptr, v_sinv_ptr, rows, offs, mask, row_mask, beta1, beta2,
                    M_KIND, V_KIND)
    if MASTER == 1:
        w = tl.load(master_ptr + offs, mask=mask, other=0.0)
    elif MASTER == 2:
        hi = tl.load(p_ptr + offs, mask=mask, other=0).to(tl.int32)
        lo = tl.load(rem_ptr + offs, mask=mask, other=0).to(tl.int32)
        hi = tl.where(lo < 0, hi - 1, hi)  # the BF16 half was rounded up: undo it
        w = ((hi << 16) | (lo & 0xFFFF)).to(tl.float32, bitcast=True)
    else:
        w = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    denom = tl.sqrt_rn(tl.div_rn(v, bc2)) + eps
    update = tl.div_rn(tl.div_rn(m, bc1), denom) + weight_decay * w
    w = w - lr * update
    if MASTER == 1:
        tl.store(master_ptr + offs, w, mask=mask)
        tl.store(p_ptr + offs, w, mask=mask)
    elif MASTER == 2:
        bits = w.to(tl.int32, bitcast=True)
        lo16 = (bits & 0xFFFF).to(tl.int16)
        hi = bits >> 16
        hi = tl.where(lo16 < 0, hi + 1, hi)  # round the BF16 half to nearest (TE's rule)
        tl.store(p_ptr + offs, hi.to(tl.int16), mask=mask)
        tl.store(rem_ptr + offs, lo16, mask=mask)
    else:
        tl.store(p_ptr + offs, w, mask=mask)
    first = tl.program_id(0) == 0
    _store_state(m_ptr, offs, mask, m, amax_ptr, m_sinv_ptr, new_m_sinv_ptr, rows, row_mask, first, M_KIND, False)
    _store_state(v_ptr, offs, mask, v, amax_ptr + 1, v_sinv_ptr, new_v_sinv_ptr, rows, row_mask, first, V_KIND,
                 True)


def launch(n: int, args_amax: tuple, args_update: tuple, *, master: int, m_kind: int, v_kind: int,
           qblock: int) -> None:
    """Run the step over ``n`` elements (pass 1 only when a moment is per-tensor FP8); ``qblock`` elements per
    ``fp8_block`` scale (``fp8_state_adam.QBLOCK``), and per tile row."""
    grid = (triton.cdiv(n, qblock * GROUPS),)
    if m_kind == 2 or v_kind == 2:
        amax_kernel[grid](*args_amax, M_KIND=m_kind, V_KIND=v_kind, QBLOCK=qblock, GROUPS=GROUPS)
    update_kernel[grid](*args_update, MASTER=master, M_KIND=m_kind, V_KIND=v_kind, QBLOCK=qblock, GROUPS=GROUPS)
