"""A tensor-parallel group and the collectives around a split unit (Megatron's ``f``/``g`` and their
sequence-parallel twins); what the split means is in :mod:`precsearch.probe.parallel.tensor_parallel`.

It lives with the backends because both sides use it: the plain probe calls these collectives
around its units, the ``te`` backend hands the group to Transformer Engine's modules and marks
their Parameters with the same attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from precsearch.backends.cross_entropy import cross_entropy

#: The attribute that marks a Parameter whose gradient each TP rank holds a share of.
PARTIAL_GRAD = "tp_partial_grad"
#: The attribute that marks a Parameter split over the TP group (each rank holds a different slice).
SPLIT = "tp_split"
#: The sequence dimension of the probe's ``(B, T, D)`` activations.
SEQ_DIM = 1


@dataclass(frozen=True)
class TensorParallel:
    """A probe's TP group: the ranks that split each block's GEMMs.

    Attributes:
        group: The process group of the ``size`` ranks (None only when ``size`` is 1).
        size: Ranks in the group.
        rank: This rank's index in the group.
        sequence_parallel: Split the residual stream along the sequence between units.
    """

    group: Any
    size: int
    rank: int
    sequence_parallel: bool

    # -- the collectives the plain probe calls around its units ------------------------------------
    def column_in(self, x: Tensor) -> Tensor:
        """The input of a column-parallel unit: gathered over the sequence (SP), or copied (its gradient summed)."""
        if self.sequence_parallel:  # backward: each rank's input gradient is a share of the sum
            return _Collective.apply(x, self, _all_gather_seq, _reduce_scatter_seq)
        return _Collective.apply(x, self, _same, _all_reduce)  # Megatron's ``f``

    def row_out(self, y: Tensor) -> Tensor:
        """The output of a row-parallel unit: the ranks' partial sums reduce-scattered over the sequence (SP),
        or all-reduced."""
        if self.sequence_parallel:
            return _Collective.apply(y, self, _reduce_scatter_seq, _all_gather_seq)
        return _Collective.apply(y, self, _all_reduce, _same)  # Megatron's ``g``

    # -- the vocabulary-parallel embedding, output layer and loss (both backends) ------------------
    def embed(self, weight: Tensor, ids: Tensor) -> Tensor:
        """Megatron's ``VocabParallelEmbedding``: each rank looks up the ids in its rows (zeros for the
        others), and the ranks' lookups are summed, reduce-scattered over the sequence under SP."""
        start = self.rank * weight.shape[0]
        outside = (ids < start) | (ids >= start + weight.shape[0])
        local = torch.nn.functional.embedding((ids - start).masked_fill(outside, 0), weight)
        return self.row_out(local.masked_fill(outside.unsqueeze(-1), 0.0))

    def cross_entropy(self, logits: Tensor, targets: Tensor) -> Tensor:
        """The mean cross-entropy (float32) of logits split over the vocabulary (``(B, T, V / size)``, this
        rank's columns), ``-100`` targets ignored: Megatron's ``vocab_parallel_cross_entropy``."""
        return cross_entropy(logits, targets, self)

    def gather_vocab(self, logits: Tensor) -> Tensor:
        """The whole vocabulary's logits from every rank's columns (no gradient: for reading logits only)."""
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.detach().contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def _all_gather_seq(x: Tensor, tp: TensorParallel) -> Tensor:
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous(), group=tp.group)
    return torch.cat(parts, dim=SEQ_DIM)


def _reduce_scatter_seq(x: Tensor, tp: TensorParallel) -> Tensor:
    if dist.get_backend(tp.group) == "nccl":
        seq_first = x.transpose(0, SEQ_DIM).contiguous()  # reduce_scatter_tensor splits dim 0
        out = seq_first.new_empty((seq_first.shape[0] // tp.size, *seq_first.shape[1:]))
        dist.reduce_scatter_tensor(out, seq_first, group=tp.group)
        return out.transpose(0, SEQ_DIM).contiguous()
    # gloo has no reduce_scatter: all-reduce and keep this rank's share (the same sums, more traffic)
    total = x.contiguous().clone()
    dist.all_reduce(total, group=tp.group)
    return total.chunk(tp.size, dim=SEQ_DIM)[tp.rank].contiguous()


def _all_reduce(x: Tensor, tp: TensorParallel) -> Tensor:
    total = x.contiguous().clone()
    dist.all_reduce(total, group=tp.group)
    return total


def _same(x: Tensor, tp: TensorParallel) -> Tensor:
    return x.view_as(x)


class _Collective(torch.autograd.Function):
    """``forward(x, tp)`` in the forward pass and ``backward(grad, tp)`` in the backward: each of the
    pairs of :meth:`TensorParallel.column_in` and :meth:`~TensorParallel.row_out` (copy / all-reduce,
    all-gather / reduce-scatter) is the other's transpose."""

    @staticmethod
    def forward(ctx, x: Tensor, tp: TensorParallel, forward: Callable, backward: Callable) -> Tensor:
        ctx.tp, ctx.backward_op = tp, backward
        return forward(x, tp)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return ctx.backward_op(grad, ctx.tp), None, None, None

