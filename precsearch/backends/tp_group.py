"""A tensor-parallel group and the collectives around a split unit (Megatron's ``f``/``g`` and their
sequence-parallel twins); what the split means is in :mod:`precsearch.probe.tensor_parallel`.

It lives with the backends because both sides use it: the plain probe calls these collectives
around its units, the ``te`` backend hands the group to Transformer Engine's modules and marks
their Parameters with the same attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

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
        return _GatherSeq.apply(x, self, True) if self.sequence_parallel else _CopyToGroup.apply(x, self)

    def row_out(self, y: Tensor) -> Tensor:
        """The output of a row-parallel unit: the ranks' partial sums reduce-scattered over the sequence (SP),
        or all-reduced."""
        return _ReduceScatterSeq.apply(y, self) if self.sequence_parallel else _ReduceFromGroup.apply(y, self)

    # -- around the replicated embedding and output layer (both backends) ---------------------------
    def scatter_seq(self, x: Tensor) -> Tensor:
        """This rank's share of the sequence of a tensor every rank holds whole (SP only; else ``x``)."""
        return _SplitSeq.apply(x, self) if self.sequence_parallel else x

    def gather_seq(self, x: Tensor) -> Tensor:
        """The whole sequence from every rank's share (SP only; else ``x``). The backward keeps this
        rank's share of the gradient: what follows (the output layer, the loss) is computed alike on every rank."""
        return _GatherSeq.apply(x, self, False) if self.sequence_parallel else x


def _all_gather_seq(x: Tensor, tp: TensorParallel) -> Tensor:
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous(), group=tp.group)
    return torch.cat(parts, dim=SEQ_DIM)


def _reduce_scatter_seq(x: Tensor, tp: TensorParallel) -> Tensor:
    # gloo has no reduce_scatter: all-reduce and keep this rank's share (the same sums, more traffic)
    total = x.contiguous().clone()
    dist.all_reduce(total, group=tp.group)
    return total.chunk(tp.size, dim=SEQ_DIM)[tp.rank].contiguous()


def _all_reduce(x: Tensor, tp: TensorParallel) -> Tensor:
    total = x.contiguous().clone()
    dist.all_reduce(total, group=tp.group)
    return total


class _CopyToGroup(torch.autograd.Function):
    """Forward: identity. Backward: the ranks' gradients summed (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x: Tensor, tp: TensorParallel) -> Tensor:
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _all_reduce(grad, ctx.tp), None


class _ReduceFromGroup(torch.autograd.Function):
    """Forward: the ranks' partial outputs summed. Backward: identity (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, x: Tensor, tp: TensorParallel) -> Tensor:
        return _all_reduce(x, tp)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _GatherSeq(torch.autograd.Function):
    """Forward: all-gather over the sequence. Backward: reduce-scatter when the ranks' gradients are partial
    (a column-parallel unit follows), else this rank's share."""

    @staticmethod
    def forward(ctx, x: Tensor, tp: TensorParallel, partial_grads: bool) -> Tensor:
        ctx.tp, ctx.partial = tp, partial_grads
        return _all_gather_seq(x, tp)

    @staticmethod
    def backward(ctx, grad: Tensor):
        tp = ctx.tp
        if ctx.partial:
            return _reduce_scatter_seq(grad, tp), None, None
        return grad.chunk(tp.size, dim=SEQ_DIM)[tp.rank].contiguous(), None, None


class _ReduceScatterSeq(torch.autograd.Function):
    """Forward: the partial outputs summed and split over the sequence. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x: Tensor, tp: TensorParallel) -> Tensor:
        ctx.tp = tp
        return _reduce_scatter_seq(x, tp)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _all_gather_seq(grad, ctx.tp), None


class _SplitSeq(torch.autograd.Function):
    """Forward: this rank's share of the sequence. Backward: all-gather (every rank's share of the gradient)."""

    @staticmethod
    def forward(ctx, x: Tensor, tp: TensorParallel) -> Tensor:
        ctx.tp = tp
        return x.chunk(tp.size, dim=SEQ_DIM)[tp.rank].contiguous()

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _all_gather_seq(grad, ctx.tp), None
