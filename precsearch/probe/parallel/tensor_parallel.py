"""Tensor parallelism for the probe: each block's GEMMs split over ``probe.tp`` processes, as Megatron-Core does.

The split is Megatron's (Shoeybi et al. 2019; sequence parallelism: Korthikanti
et al. 2022). In every block:

* ``linear_qkv`` and ``linear_fc1`` are **column-parallel**: each rank holds a
  contiguous share of the output rows. For ``linear_qkv`` that is
  ``n_kv_heads / tp`` whole query groups (Megatron's grouped layout keeps a
  group's query, key and value rows together), so each rank attends over its
  own heads; for ``linear_fc1`` it is the rank's share of the gate rows and the
  same share of the up rows (SwiGLU pairs them).
* ``linear_proj`` and ``linear_fc2`` are **row-parallel**: each rank holds the
  input columns that match its heads (or FFN rows), and the partial outputs
  are summed over the ranks.
* With ``sequence_parallel`` the residual stream between blocks is split along
  the sequence: a column-parallel unit all-gathers its input, a row-parallel
  one reduce-scatters its output (instead of an all-reduce), so norms and
  residuals hold ``1/tp`` of the tokens.

The embedding and the output layer are split over the vocabulary, as
Megatron-Core's ``VocabParallelEmbedding`` and column-parallel output layer:
each rank holds ``vocab_size / tp`` rows of each, the lookups are summed over
the ranks (reduce-scattered over the sequence under SP), and the loss is
computed from each rank's share of the logits by reducing the row max, the
sum of exponentials and the target's logit over the group
(:meth:`~precsearch.backends.tp_group.TensorParallel.cross_entropy`), so no
rank holds a whole row of logits. Every rank gets the same whole-batch loss.
The final norm is the one Parameter of the model that every rank holds whole.

Two backends implement the split: the plain probe (CPU, the emulated backend,
torchao) calls the collectives below around its units
(:class:`~precsearch.backends.tp_group.TensorParallel` is what the model's ``tp_in``/``tp_out`` hooks
call); Transformer Engine's modules take ``tp_group``, ``parallel_mode`` and
``sequence_parallel`` and run the same collectives inside their fused kernels
(:func:`precsearch.backends.te_stack.build_te_stack`), so the model's block
hooks stay identities there.

**Gradients that are partial sums.** A Parameter that sees only a share of the
work on each rank gets only a share of its gradient, and the shares are summed
over the TP group after the backward (:func:`sum_partial_grads`). Such
Parameters are marked with the attribute ``tp_partial_grad``: under sequence
parallelism every norm weight (each rank normalises its own tokens); in the
plain probe also the norms fused into the column-parallel units (their input
gradient is summed only after the norm, where the collective sits); Transformer
Engine sums that one before its norm's backward.

**FP8 scales.** Delayed scaling must see the amax of the whole tensor on every
rank, or ranks quantize the same logical tensor with different scales
(Megatron-LM #442, training that diverged at TP 8 until the amax reduction
group covered the TP group): the delayed scalers reduce their amax over the
world (TP x DP), which is TE's default group and Megatron's amax reduction
group. Current scaling quantizes each rank's own shard with its own scale, as
TE does (TE reduces the amax over the TP group only for the input it gathers
in FP8 under sequence parallelism; the plain probe gathers in BF16 and then
quantizes the gathered tensor, which gives that same scale).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from precsearch.arch.config import unsplittable
from precsearch.backends.tp_group import PARTIAL_GRAD, SPLIT, TensorParallel

__all__ = ["PARTIAL_GRAD", "SPLIT", "TensorParallel", "clip_grad_norm", "split_model", "sum_partial_grads"]

# -- splitting the plain probe -------------------------------------------------------------------------


def split_model(model: nn.Module, tp: TensorParallel) -> None:
    """Keep this rank's slice of every block's GEMM weights, the embedding and the output layer, in place,
    and wire the collectives.

    Run on the whole model that every rank built from the same seed, before a
    backend converts its units; sets ``model.tensor_parallel`` (backends read it).
    Each attention module gets the rank's head counts in its ``cfg``.
    """
    cfg = model.cfg
    if (name := unsplittable(cfg, tp.size)) is not None:
        raise ValueError(f"tensor parallelism over {tp.size} ranks needs {name} ({getattr(cfg, name)}) "
                         f"divisible by {tp.size}")
    model.tensor_parallel = tp
    # the rank's heads (dim scaled with them, so that head_dim stays): what split_qkv reads
    local = dataclasses.replace(cfg, dim=cfg.dim // tp.size, n_heads=cfg.n_heads // tp.size,
                                n_kv_heads=cfg.n_kv_heads // tp.size)
    for layer in model.decoder.layers:
        attn, mlp = layer.self_attention, layer.mlp
        _keep_rows(attn.linear_qkv, tp)
        _keep_columns(attn.linear_proj, tp)
        gate, up = mlp.linear_fc1.weight.detach().chunk(2, dim=0)
        _set_weight(mlp.linear_fc1, torch.cat([gate.chunk(tp.size)[tp.rank], up.chunk(tp.size)[tp.rank]]))
        _keep_columns(mlp.linear_fc2, tp)
        attn.cfg = local
        attn.tp_in = mlp.tp_in = tp.column_in
        attn.tp_out = mlp.tp_out = tp.row_out
        for unit in (attn.linear_qkv, mlp.linear_fc1):
            setattr(unit.layer_norm_weight, PARTIAL_GRAD, True)  # its input gradient is summed after the norm
    _keep_rows(model.embedding.word_embeddings, tp)
    _keep_rows(model.output_layer, tp)
    if tp.sequence_parallel:
        setattr(model.decoder.final_layernorm.weight, PARTIAL_GRAD, True)


def _set_weight(module: nn.Linear | nn.Embedding, weight: Tensor) -> None:
    # a copy, not a view: the whole weight's storage is freed once the model drops it
    module.weight = nn.Parameter(weight.clone(memory_format=torch.contiguous_format),
                                 requires_grad=module.weight.requires_grad)
    setattr(module.weight, SPLIT, True)
    if isinstance(module, nn.Embedding):
        module.num_embeddings = weight.shape[0]
    else:
        module.out_features, module.in_features = weight.shape


def _keep_rows(module: nn.Linear | nn.Embedding, tp: TensorParallel) -> None:
    _set_weight(module, module.weight.detach().chunk(tp.size, dim=0)[tp.rank])


def _keep_columns(linear: nn.Linear, tp: TensorParallel) -> None:
    _set_weight(linear, linear.weight.detach().chunk(tp.size, dim=1)[tp.rank])


# -- after the backward ----------------------------------------------------------------------------------


def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: this rank's shard


def sum_partial_grads(model: nn.Module, tp: TensorParallel) -> None:
    """Sum over the TP group the gradients each rank holds a share of (Parameters marked ``tp_partial_grad``)."""
    for p in model.parameters():
        if p.grad is not None and getattr(p, PARTIAL_GRAD, False):
            dist.all_reduce(_local(p.grad), group=tp.group)


def clip_grad_norm(model: nn.Module, max_norm: float, tp: TensorParallel, dp_group: Any = None) -> Tensor:
    """The whole model's gradient norm (clipped to ``max_norm`` in place), as one process would compute it.

    Split Parameters' squares are summed over every rank (TP slices, and FSDP2
    shards when ``dp_group`` is set); replicated ones' over the data-parallel
    group only, since each TP rank holds the same copy.
    """
    split, replicated = _square_sums(model)
    if dp_group is not None:
        dist.all_reduce(replicated, group=dp_group)
    dist.all_reduce(split)
    norm = (split + replicated).sqrt()
    value = float(norm)
    coef = max_norm / (value + 1e-6)
    if math.isfinite(value) and coef < 1:
        for p in model.parameters():
            if p.grad is not None:
                _local(p.grad).mul_(coef)
    return norm


def _square_sums(model: nn.Module) -> tuple[Tensor, Tensor]:
    grads = [(p, _local(p.grad)) for p in model.parameters() if p.grad is not None]
    device = grads[0][1].device if grads else torch.device("cpu")
    split = torch.zeros((), dtype=torch.float64, device=device)
    replicated = torch.zeros((), dtype=torch.float64, device=device)
    for p, g in grads:
        square = g.detach().double().pow(2).sum()
        if getattr(p, SPLIT, False):
            split += square
        else:
            replicated += square
    return split, replicated
