"""The largest causal attention logit of one attention layer, computed without the full score matrix.

Wortsman et al. 2023 (arXiv 2309.14322) trace one small-scale instability to attention logits that keep
growing until the softmax collapses onto one key (entropy collapse); the max logit is its early sign.
This module computes it for grouped-query attention, ``max_{b, h, i, j <= i} scale * <q[b,h,i], k[b,g(h),j]>``,
where query head ``h`` reads key head ``g(h) = h // (n_heads // n_kv_heads)`` (each key/value head serves
that many consecutive query heads, the Llama 3 / Megatron / TE layout), and ``j <= i`` is the causal mask:
future keys never enter the softmax, so a large logit there is no risk and is ignored.

Memory: one key/value head and ``query_chunk`` queries at a time, so the largest temporary is
``batch x group x query_chunk x T`` float32 values (1 x 4 x 512 x 8192 x 4 B = 64 MiB), never ``H x T x T``.
Queries of a chunk only meet the keys up to the chunk's end.
"""

from __future__ import annotations

import torch
from torch import Tensor


def max_attention_logit(q: Tensor, k: Tensor, scale: float, *, query_chunk: int = 512,
                        max_batch: int | None = None) -> Tensor:
    """The largest causally visible attention logit, as a 0-d float32 tensor on ``q``'s device.

    Args:
        q: Queries ``(B, H, T, D)`` (after rotary embedding, as the softmax sees them).
        k: Keys ``(B, Hkv, T, D)``; ``H`` must be a multiple of ``Hkv``.
        scale: The softmax scale, usually ``D ** -0.5``.
        query_chunk: Queries per chunk (bounds memory, see the module docstring).
        max_batch: Use only the first this many sequences (None: all), to keep a stat step cheap.

    Returns:
        The max over sequences, query heads and causal (query, key) pairs; NaN if a logit is NaN.

    Raises:
        ValueError: On shapes that do not fit together.
    """
    _check_shapes(q, k, query_chunk)
    if max_batch is not None:
        q, k = q[:max_batch], k[:max_batch]
    group = q.shape[1] // k.shape[1]
    seq = q.shape[2]
    best = torch.full((), -torch.inf, device=q.device, dtype=torch.float32)
    for g in range(k.shape[1]):
        keys = k[:, g].detach().float()  # (B, T, D)
        queries = q[:, g * group:(g + 1) * group].detach().float()  # (B, group, T, D)
        for start in range(0, seq, query_chunk):
            end = min(start + query_chunk, seq)
            logits = torch.einsum("bhid,bjd->bhij", queries[:, :, start:end], keys[:, :end]) * scale
            logits = logits.masked_fill(_future(start, end, q.device), -torch.inf)
            best = torch.maximum(best, _nan_max(logits))
    return best


def _future(start: int, end: int, device: torch.device) -> Tensor:
    """True where key ``j`` lies after query ``i`` (rows: queries start..end-1, columns: keys 0..end-1)."""
    rows = torch.arange(start, end, device=device).unsqueeze(1)
    cols = torch.arange(end, device=device).unsqueeze(0)
    return cols > rows


def _nan_max(x: Tensor) -> Tensor:
    """Max that propagates NaN (``amax`` would too, but say so: a NaN logit must not read as small)."""
    return torch.where(torch.isnan(x).any(), torch.tensor(torch.nan, device=x.device), x.amax())


def _check_shapes(q: Tensor, k: Tensor, query_chunk: int) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be (B, H, T, D) and (B, Hkv, T, D), got {tuple(q.shape)} and {tuple(k.shape)}")
    (b, h, t, d), (bk, hkv, tk, dk) = q.shape, k.shape
    if (b, t, d) != (bk, tk, dk):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, length or head size")
    if hkv == 0 or h % hkv:
        raise ValueError(f"{h} query heads cannot share {hkv} key/value heads evenly")
    if query_chunk < 1:
        raise ValueError(f"query_chunk must be >= 1, got {query_chunk}")
