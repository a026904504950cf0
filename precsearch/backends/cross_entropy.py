"""The probe's loss: a float32 cross-entropy that holds the memory Megatron-Core's does.

``F.cross_entropy(logits.float())`` keeps three float32 logit-sized tensors alive when its backward runs
(the log-softmax output, the gradient in and the gradient out): 5.9 GiB at seq 4096 x vocab 128256,
and the probe's measured 3 GiB over Megatron-Core at the Llama-3-8B shape (docs/frameworks.md).
Like Megatron's ``vocab_parallel_cross_entropy``, :class:`_SoftmaxCrossEntropy` makes one float32 copy
of the logits, turns it into the softmax in place, keeps that for the backward and turns it into the
gradient in place: one float32 tensor, plus the BF16 gradient autograd casts it to for BF16 logits
(:data:`LOGIT_BYTES`). The math is the same float32 log-sum-exp as ``F.cross_entropy``'s.

With a tensor-parallel group (:class:`~precsearch.backends.tp_group.TensorParallel`) each rank holds a
slice of the vocabulary; the row max, the sum of exponentials and the target's logit are reduced
over the group, so no rank ever holds a whole row.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

#: Target id that is left out of the mean (``F.cross_entropy``'s default ``ignore_index``).
IGNORE = -100

#: Bytes per BF16 logit alive at the loss's peak: the float32 softmax (later the gradient, in place) and
#: the BF16 gradient of the logits it is cast to. The probe's logits are BF16 (autocast) at every
#: ``param_dtype``.
LOGIT_BYTES = 4 + 2


def cross_entropy(logits: Tensor, targets: Tensor, tp: Any = None) -> Tensor:
    """The mean float32 cross-entropy over the targets that are not :data:`IGNORE`.

    Args:
        logits: ``(..., V)``; with ``tp``, this rank's ``V / tp.size`` columns (rank ``r`` holds columns
            ``r * V / size`` on).
        targets: ``(...)`` token ids into the whole vocabulary.
        tp: the tensor-parallel group the vocabulary is split over, or None.
    """
    flat, flat_targets = logits.flatten(0, -2), targets.flatten()
    losses = _SoftmaxCrossEntropy.apply(flat, flat_targets, tp)
    valid = flat_targets != IGNORE
    return (losses * valid).sum() / valid.sum()


class _SoftmaxCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of ``(N, V)`` logits; the softmax kept for the backward is the only
    float32 copy, and the backward writes the gradient into it. Its backward runs once (a second
    ``backward`` through the same graph would read the gradient as the softmax)."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, tp: Any) -> Tensor:
        with torch.autocast(logits.device.type, enabled=False):
            x = logits.float()
            if x.data_ptr() == logits.data_ptr():  # float32 logits: never write the caller's tensor
                x = x.clone()
            width = x.shape[-1]
            start = tp.rank * width if tp is not None else 0
            mine = (targets >= start) & (targets < start + width)  # the target's column is on this rank
            local = (targets - start).masked_fill(~mine, 0)
            row_max = x.max(dim=-1).values
            if tp is not None:
                dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=tp.group)
            target_logit = (x.gather(-1, local.unsqueeze(-1)).squeeze(-1) - row_max) * mine
            x.sub_(row_max.unsqueeze(-1)).exp_()
            total = x.sum(dim=-1)
            if tp is not None:
                both = torch.stack([total, target_logit])
                dist.all_reduce(both, group=tp.group)
                total, target_logit = both[0], both[1]
            x.div_(total.unsqueeze(-1))  # the softmax, kept for the backward
        ctx.save_for_backward(x, local, mine)
        return total.log() - target_logit

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        softmax, local, mine = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        softmax[rows, local] -= mine.to(softmax.dtype)  # softmax - one-hot, in place
        softmax.mul_(grad.unsqueeze(-1))
        return softmax, None, None
