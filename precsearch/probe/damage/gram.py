"""Means, spreads and their standard errors from the Gram matrix of K vectors.

The fixed-state reading compares gradients (and updates) of K independent
batches. Everything it reports is a function of the K x K matrix of inner
products ``M[j, k] = <x_j, x_k>`` of those vectors, so the vectors themselves
(each the size of the model's weights) are never averaged twice, and a
jackknife over the batches (leave one batch out: the (K-1) x (K-1) sub-matrix)
gives each figure's standard error from the same numbers.

For vectors x_1..x_K drawn independently with mean mu and covariance Sigma:

* :func:`spread`: the unbiased estimate of ``trace(Sigma)``, the expected
  squared distance of one vector from the mean (for batch gradients: the
  minibatch gradient noise at that batch size);
* :func:`mean_sq`: the unbiased estimate of ``|mu|^2`` (the squared norm of the
  mean minus the part the sampling noise adds, ``trace(Sigma) / K``); it can be
  negative when mu is small next to the noise, which says "indistinguishable
  from 0", so callers clamp only when they display.

The matrix itself is summed over chunks of the vectors (:func:`gram_of_stacked`:
a K x chunk block's ``X X^T`` in float64), so no vector need be whole at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def spread(gram: Tensor) -> float:
    """Unbiased ``trace(Sigma)``: ``sum_k |x_k - mean|^2 / (K - 1)``; needs K >= 2."""
    k = gram.shape[0]
    if k < 2:
        raise ValueError(f"a spread needs at least 2 vectors, got {k}")
    return float((gram.trace() - gram.sum() / k) / (k - 1))


def mean_sq(gram: Tensor) -> float:
    """Unbiased ``|mu|^2``: ``|mean|^2 - spread / K`` (may be negative when mu is lost in the noise)."""
    k = gram.shape[0]
    return float(gram.sum() / k**2) - spread(gram) / k


def jackknife(gram: Tensor, statistic: Callable[[Tensor], float]) -> tuple[float, float]:
    """``statistic(gram)`` and its jackknife standard error over the K vectors (NaN below K = 3)."""
    k = gram.shape[0]
    value = statistic(gram)
    if k < 3:
        return value, math.nan
    keep = [torch.tensor([j for j in range(k) if j != i]) for i in range(k)]
    leave_one_out = torch.tensor([statistic(gram[idx][:, idx]) for idx in keep], dtype=torch.float64)
    se = math.sqrt((k - 1) / k * float(((leave_one_out - leave_one_out.mean()) ** 2).sum()))
    return value, se


def ratio(numerator: Callable[[Tensor], float], denominator: Callable[[Tensor], float],
          grams: tuple[Tensor, Tensor]) -> tuple[float, float]:
    """``numerator(grams[0]) / denominator(grams[1])`` and its jackknife standard error.

    Both Gram matrices are over the same K batches (row k of each is batch k), so one
    batch is left out of both at once.
    """
    a, b = grams
    stacked = torch.stack([a, b])  # jackknife over the batch index of both together

    def of(g: Tensor) -> float:
        den = denominator(g[1])
        return numerator(g[0]) / den if den > 0 else math.nan

    k = a.shape[0]
    value = of(stacked)
    if k < 3:
        return value, math.nan
    values = []
    for i in range(k):
        idx = torch.tensor([j for j in range(k) if j != i])
        values.append(of(stacked[:, idx][:, :, idx]))
    loo = torch.tensor(values, dtype=torch.float64)
    return value, math.sqrt((k - 1) / k * float(((loo - loo.mean()) ** 2).sum()))


#: Elements of each vector :func:`gram_of` takes at once (a K x chunk float64 block).
GRAM_CHUNK = 2**20


def gram_of_stacked(x: Tensor, out: Tensor | None = None) -> Tensor:
    """The float64 Gram matrix ``x.double() @ x.double().T`` of the K x n block ``x`` (row k: a chunk of vector k).

    With ``out`` (K x K float64, on ``x``'s device) the block's matrix is added into it and ``out`` returned:
    summed over the chunks of K vectors this is their Gram matrix, with no host sync (read it once at the end).
    The products of float32 (or BF16) values are exact in float64; only the order of the sums differs from
    pairwise dot products. The result may be asymmetric by rounding: :func:`symmetric` mirrors it.
    """
    xd = x.double()
    if out is None:
        return xd @ xd.T
    return out.addmm_(xd, xd.T)


def symmetric(gram: Tensor) -> Tensor:
    """``gram`` (..., K, K) with its upper triangle mirrored below the diagonal."""
    upper = gram.triu()
    return upper + upper.triu(1).transpose(-1, -2)


def gram_of(vectors: list[Tensor], weight: Tensor | None = None, chunk: int = GRAM_CHUNK) -> Tensor:
    """The float64 Gram matrix of ``vectors`` (flattened), optionally each multiplied by ``weight`` first.

    Computed ``chunk`` elements of every vector at a time (:func:`gram_of_stacked`); returned on the host.
    """
    k = len(vectors)
    if k == 0:
        return torch.zeros(0, 0, dtype=torch.float64)
    flat = [(v * weight if weight is not None else v).reshape(-1) for v in vectors]
    n, device = flat[0].numel(), flat[0].device
    if any(f.numel() != n for f in flat):
        raise ValueError(f"vectors of different sizes: {sorted({f.numel() for f in flat})}")
    out = torch.zeros(k, k, dtype=torch.float64, device=device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        block = torch.empty(k, stop - start, dtype=torch.float64, device=device)
        for i, f in enumerate(flat):
            block[i].copy_(f[start:stop])
        gram_of_stacked(block, out)
    return symmetric(out).cpu()
