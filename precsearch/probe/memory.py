"""A model of peak training memory, for where it cannot be measured (CPU) or
for shapes that were not run (the full-depth target).

It counts the bytes alive at the start of the backward pass of one step of
the probe's own set-up (parameters in fp32 or BF16, ``torch.autocast`` to
BF16, torch AdamW whose moments take the parameters' dtype):

* parameters, gradients and two AdamW moments: 4 + 4 + 8 bytes/param in fp32,
  2 + 2 + 4 in BF16; with the policy's memory knobs, FP32 master weights
  (+4 bytes/param), moments in another dtype, and FP8 weights (an FP8 layer's
  weight stored as FP8 data plus its transpose, 1 + 1 bytes/param, and no
  per-step copy);
* the low-precision weight copies a step keeps for its backward: with fp32
  parameters, a BF16 cast (2 bytes/param) for a BF16 Linear (none with BF16
  parameters); for an FP8 Linear, the FP8 weight and its
  transpose (1 + 1 bytes/param; Hopper's FP8 GEMMs need both layouts, as in
  Transformer Engine);
* activations saved for the backward: each Linear's input at 2 bytes (BF16) or
  1 byte (FP8) per element, plus the rest of each block (RMSNorm in fp32, the
  attention's q/k/v/output, SwiGLU's gate/up/product) at fixed widths that FP8
  does not change;
* the logits (BF16) and their fp32 copy and gradient for the cross-entropy.

Every figure from this module is a prediction and is labelled so where it is
reported. It is not calibrated against a GPU measurement yet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Precision
from precsearch.probe.model import ModelConfig

_FP32, _BF16, _FP8 = 4, 2, 1


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes by component; ``total`` is the predicted peak."""

    params: int
    grads: int
    optimizer: int
    weight_copies: int
    linear_inputs: int
    other_activations: int
    logits: int

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    def to_dict(self) -> dict[str, int]:
        return asdict(self) | {"total": self.total}


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) for each Linear layer suffix of one block, and lm_head."""
    kv = cfg.n_kv_heads * cfg.head_dim
    return {
        "self_attn.q_proj": (cfg.dim, cfg.dim),
        "self_attn.k_proj": (cfg.dim, kv),
        "self_attn.v_proj": (cfg.dim, kv),
        "self_attn.o_proj": (cfg.dim, cfg.dim),
        "mlp.gate_proj": (cfg.dim, cfg.ffn_dim),
        "mlp.up_proj": (cfg.dim, cfg.ffn_dim),
        "mlp.down_proj": (cfg.ffn_dim, cfg.dim),
    }


def _layers(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    shapes = {
        f"model.layers.{i}.{suffix}": shape
        for i in range(cfg.n_layers)
        for suffix, shape in linear_shapes(cfg).items()
    }
    shapes["lm_head"] = (cfg.dim, cfg.vocab_size)
    return shapes


def predict_peak(
    cfg: ModelConfig, precisions: dict[str, Precision], *, seq_len: int, micro_batch: int,
    param_dtype: str = "fp32", memory: MemoryKnobs | None = None,
) -> MemoryBreakdown:
    """Predicted peak bytes of one training step; layers missing from ``precisions`` are BF16."""
    memory = memory or MemoryKnobs()
    tokens = seq_len * micro_batch
    n_params = cfg.num_params()
    width = _FP32 if param_dtype == "fp32" else _BF16
    bf16_copy = _BF16 if param_dtype == "fp32" else 0  # autocast casts fp32 weights; BF16 ones are used as-is
    copies = inputs = fp8_stored = 0
    for name, (fan_in, fan_out) in _layers(cfg).items():
        fp8 = precisions.get(name, Precision.BF16).is_fp8
        if fp8 and memory.fp8_weights:
            fp8_stored += fan_in * fan_out  # the weight lives as FP8 + transpose: no per-step copy
        else:
            copies += fan_in * fan_out * (2 * _FP8 if fp8 else bf16_copy)
        inputs += tokens * fan_in * (_FP8 if fp8 else _BF16)
    moment = {"fp32": _FP32, "bf16": _BF16}[memory.moments(param_dtype)]
    master = _FP32 if memory.uses_master_weights and width != _FP32 else 0
    return MemoryBreakdown(
        params=(n_params - fp8_stored) * width + fp8_stored * 2 * _FP8,
        grads=n_params * width,
        optimizer=n_params * (2 * moment + master),
        weight_copies=copies,
        linear_inputs=inputs,
        other_activations=_other_activations(cfg, tokens),
        logits=tokens * cfg.vocab_size * (_BF16 + 2 * _FP32),
    )


def _other_activations(cfg: ModelConfig, tokens: int) -> int:
    kv = cfg.n_kv_heads * cfg.head_dim
    norms = 2 * tokens * cfg.dim * _FP32  # two RMSNorm inputs per block, fp32 residual
    attention = tokens * (2 * cfg.dim + 2 * kv) * _BF16 + tokens * cfg.n_heads * _FP32  # q,k,v,out + lse
    swiglu = 3 * tokens * cfg.ffn_dim * _BF16  # gate, up, silu(gate)
    embed_and_final = tokens * cfg.dim * (_FP32 + _FP32)  # embedding output, final norm input
    return cfg.n_layers * (norms + attention + swiglu) + embed_and_final
