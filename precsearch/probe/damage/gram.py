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


def gram_of(vectors: list[Tensor], weight: Tensor | None = None) -> Tensor:
    """The float64 Gram matrix of ``vectors`` (flattened), optionally each multiplied by ``weight`` first."""
    k = len(vectors)
    out = torch.zeros(k, k, dtype=torch.float64)
    flat = [(v * weight if weight is not None else v).reshape(-1) for v in vectors]
    for i in range(k):
        a = flat[i].double()  # one float64 copy at a time: a unit's weight can be half a billion values
        for j in range(i, k):
            out[i, j] = out[j, i] = float(a @ flat[j].double())
    return out
