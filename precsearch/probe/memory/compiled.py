"""What a ``torch.compile``'d Llama block saves for its backward (torchtitan's per-block compile).

:func:`~precsearch.probe.memory.peak.predict_peak` counts eager autograd. Compiled, AOTAutograd's partitioner
recomputes cheap pointwise results in the backward instead of saving them, so a compiled block holds less;
torchao's FP8 Linears let it recompute more (their input casts). The counts below are those of what the
compiled blocks saved on the H200 (``benchmarks/torchao_saved.py``, 2 Hugging Face Llama blocks at the 8B width,
seq 4096, FP32 parameters under BF16 autocast, torchao 0.16, torch 2.11; 2026-12-03,
``2026-12-03_h200_torchao_saved.json@e2a4785``), per block and token:

* every block: one FP32 residual-stream tensor, q and the attention output (BF16, ``dim`` wide), k and v
  (BF16, ``n_kv_heads * head_dim``), the attention's FP32 log-sum-exp per head, two FP32 RMS values, SwiGLU's
  gate and up outputs (BF16, ``ffn_dim`` each), and ``linear_proj``'s input (BF16, ``dim``);
* a BF16 unit also its BF16 input (``linear_qkv`` and ``linear_fc1``: ``dim``; ``linear_fc2``: ``ffn_dim``)
  and autocast's BF16 cast of its weight (counted by the model's weight copies, as eager); a torchao FP8 unit
  neither (the partitioner recomputes its input from the saved residual and the norm, the weight cast from
  the parameter).

An all-BF16 block saved 3 ``ffn_dim``-wide and 3 ``dim``-wide BF16 tensors, an all-FP8 block 2 and 1, both one
FP32 residual (the final norm, outside the blocks and eager, holds two more). Which unit keeps which input
is inferred from those two blocks; the mixed policy (FP8 attention, BF16 MLP: its ``linear_proj`` input and
the MLP's) checks the inference against the 4-block compiled runs of the same call
(``2026-12-03_h200_bench_frameworks_torchtitan_compiled.txt@e2a4785``): ``tests/probe/memory/test_compiled.py``.
Outside the blocks (eager): the final norm (FP32 input and output, 1/rms), the output layer's BF16 input,
the token ids, and RoPE's FP32 cos/sin once.

With BF16 parameters (Accelerate's export of a master-weights policy loads the model in BF16) the residual
stream is BF16: each block's residual tensor, the final norm's input and RoPE's tables are BF16 (the norm's FP32
upcast stays), and no weight is cast. Read off compiled Hugging Face blocks listed on the CPU (2026-12-06), whose
FP32-parameter listing has the H200's counts exactly; it predicted Accelerate's compiled 4-block run of that
policy on an H100 (25.35 GiB) within 0.01%. Measured for FP32 and BF16 parameters and torchao's FP8 Linear only:
:func:`compiled_activation_bytes` refuses anything else.
"""

from __future__ import annotations

from precsearch.arch.config import ModelConfig
from precsearch.precision import Precision
from precsearch.recipes import DEFAULT_PRECISION

_FP32, _BF16 = 4, 2

#: Bytes per element of the residual stream by parameter dtype: the embedding's output and each block's sum stay
#: in the parameters' dtype under autocast.
_RESIDUAL = {"fp32": _FP32, "bf16": _BF16}

#: Block units that save their BF16 input when they run in BF16, by the width of that input.
_BF16_SAVES_INPUT = {"self_attention.linear_qkv": "dim", "mlp.linear_fc1": "dim", "mlp.linear_fc2": "ffn_dim"}


def _check(precisions: dict[str, Precision], param_dtype: str, fp8_linear: str) -> None:
    if param_dtype not in _RESIDUAL:
        raise ValueError(f"compiled blocks: param_dtype={param_dtype!r}; the rule was measured with FP32 and BF16 "
                         "parameters under BF16 autocast only")
    if fp8_linear != "torchao" and any(p.is_fp8 for p in precisions.values()):
        raise ValueError(f"compiled blocks: fp8_linear={fp8_linear!r}; the rule was measured with torchao's "
                         "Float8Linear only")


def compiled_activation_bytes(cfg: ModelConfig, precisions: dict[str, Precision], *, seq_len: int,
                              micro_batch: int, param_dtype: str = "fp32",
                              fp8_linear: str = "torchao") -> tuple[int, int]:
    """(Linear inputs, other activations) saved for the backward by a model whose blocks are compiled, in
    bytes (weights and logits excluded, as :func:`~precsearch.probe.memory.peak.activation_bytes`)."""
    _check(precisions, param_dtype, fp8_linear)
    tokens = seq_len * micro_batch
    kv = cfg.n_kv_heads * cfg.head_dim
    width = {"dim": cfg.dim, "ffn_dim": cfg.ffn_dim}
    residual = _RESIDUAL[param_dtype]
    block_other = (cfg.dim * residual + (2 * cfg.dim + 2 * kv) * _BF16 + cfg.n_heads * _FP32 + 2 * _FP32
                   + 2 * cfg.ffn_dim * _BF16)
    inputs = 0
    for i in range(cfg.n_layers):
        inputs += cfg.dim * _BF16  # linear_proj's input, whatever its precision
        for suffix, which in _BF16_SAVES_INPUT.items():
            if not precisions.get(f"decoder.layers.{i}.{suffix}", DEFAULT_PRECISION).is_fp8:
                inputs += width[which] * _BF16
    inputs += cfg.dim * _BF16  # the output layer's BF16 input (eager, outside the blocks)
    final_norm = cfg.dim * (residual + _FP32) + _FP32  # its input, its FP32 upcast, 1/rms
    rope = 2 * seq_len * cfg.head_dim * residual  # cos and sin, in the parameters' dtype
    other = tokens * (cfg.n_layers * block_other + final_norm + 8) + rope
    return tokens * inputs, other
