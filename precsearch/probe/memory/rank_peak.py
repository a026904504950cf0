"""The memory model for one rank of a probe on several processes: FSDP2 shards, tensor-parallel slices.

:func:`predict_rank_peak` applies the split of :mod:`precsearch.probe.parallel.distributed` (FSDP2 over the
data-parallel groups) and :mod:`precsearch.probe.parallel.tensor_parallel` (each block's GEMMs over ``tp``
ranks) to the one-process model of :mod:`precsearch.probe.memory.peak`, component by component.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from precsearch.arch.config import ModelConfig
from precsearch.arch.units import NORMED_UNITS, OUTPUT_LAYER
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.probe.memory.peak import (MemoryBreakdown, fp8_attention_saving, linear_shapes, other_activation_bytes,
                                     predict_peak, saved_linear_input_bytes, unit_weight_bytes)
from precsearch.probe.runner import backend_precisions

_FP32, _BF16 = 4, 2


def predict_rank_peak(cfg: ModelConfig, probe: ProbeSection, policy: Policy) -> MemoryBreakdown:
    """The memory model's peak for one of ``probe.nproc`` ranks (``micro_batch`` is the global batch).

    With ``tp`` ranks per tensor-parallel group and ``nproc / tp`` data-parallel groups:

    * **Training state.** Each block's GEMM weights, the embedding and the output layer (split over
      the vocabulary), their gradients and optimizer state are split over the TP group; only the
      norms are whole on each TP rank. FSDP2 (more than one data-parallel group) then splits what a
      rank holds over the groups.
    * **Weight copies.** Low-precision copies are the rank's slice (``1/tp``). Under FSDP2 the backward
      also sees unsharded parameters: the root's (embeddings, final norm, head, which FSDP2 keeps
      gathered after the forward) and two blocks' (the one computing and the one prefetched), plus
      autocast's BF16 casts of BF16 layers. FP8 layers keep no weight copy there: Transformer Engine
      re-quantizes the weight from the re-gathered one in the backward (``module/linear.py``,
      "Backward will re-quantize from the FSDP2 all-gathered weight", TE issue #2681).
    * **Activations** of the rank's rows. Attention, SwiGLU and the inputs of ``linear_proj`` and
      ``linear_fc2`` are split over the TP group (each rank has its own heads and FFN rows); the
      norms and the inputs of ``linear_qkv`` and ``linear_fc1`` (the residual stream) only under
      sequence parallelism (each rank keeps its own tokens; TE re-gathers them in the backward).
      The logits are split over the vocabulary; the output layer's input is whole (gathered).
    """
    tp, groups = probe.tp, probe.nproc // probe.tp
    rows = probe.micro_batch // groups
    precisions = backend_precisions(policy, cfg)
    own = predict_peak(cfg, precisions, seq_len=probe.seq_len, micro_batch=rows, param_dtype=probe.param_dtype,
                       memory=policy.memory, grad_accum=probe.grad_accum)
    n_params = cfg.num_params()
    weights = _weights(cfg, precisions, probe, policy)
    gemms = sum(w.elements for w in weights.values())  # the block GEMMs and the output layer
    split = gemms + cfg.vocab_size * cfg.dim  # and the embedding
    state = Fraction(n_params * tp - split * (tp - 1), n_params * tp * groups)  # the share of the training state
    if groups == 1:
        copies = sum(w.copies for w in weights.values()) / tp
    else:
        # with fp8_weights the model counts no copy for FP8 layers and the same copies for BF16 ones
        bf16_copies = sum(w.copies for w in _weights(cfg, precisions, probe, policy, fp8_weights=True).values()) / tp
        root = 2 * cfg.vocab_size * cfg.dim / tp + cfg.dim
        block = (n_params - 2 * cfg.vocab_size * cfg.dim - cfg.dim) / cfg.n_layers
        block_local = block - (gemms - weights[OUTPUT_LAYER].elements) / cfg.n_layers * (1 - 1 / tp)
        copies = bf16_copies + (root + 2 * block_local) * (_FP32 if probe.param_dtype == "fp32" else _BF16)
    stream = tp if probe.sequence_parallel else 1  # what divides the residual stream's tensors
    split = {suffix: stream if suffix in NORMED_UNITS else tp for suffix in linear_shapes(cfg)}
    tokens = probe.seq_len * rows
    return dataclasses.replace(
        own, params=_share(own.params, state), grads=_share(own.grads, state),
        accumulated_grads=_share(own.accumulated_grads, state),
        optimizer=_share(own.optimizer, state), master=_share(own.master, state),
        step_transient=_share(own.step_transient, state),
        weight_copies=int(copies), logits=own.logits // tp,
        linear_inputs=int(tokens * saved_linear_input_bytes(cfg, precisions, probe.param_dtype, split)),
        other_activations=other_activation_bytes(cfg, seq_len=probe.seq_len, micro_batch=rows,
                                                 param_dtype=probe.param_dtype, heads_split=tp, tokens_split=stream)
        - fp8_attention_saving(cfg, precisions, policy.memory, tokens) // tp)


def _weights(cfg, precisions, probe, policy, fp8_weights: bool | None = None):
    memory = policy.memory if fp8_weights is None else dataclasses.replace(policy.memory, fp8_weights=fp8_weights)
    return unit_weight_bytes(cfg, precisions, probe.param_dtype, memory)


def _share(total: int, fraction: Fraction) -> int:
    return math.ceil(total * fraction)  # FSDP2 pads each parameter to a multiple of the ranks: round up
