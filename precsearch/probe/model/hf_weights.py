"""Weights between the probe's Megatron-Core layout and Hugging Face ``LlamaForCausalLM``.

Only the layout differs: Megatron fuses q/k/v into one matrix whose rows are
grouped per KV head (the group's query heads, then its key head, then its value
head) and gate/up into one matrix (gate rows, then up rows), and fuses each
block's RMSNorm weight into the GEMM module that follows it. The conversion is
exact (a permutation and a split), so logits agree to the bit in float32.
"""

from __future__ import annotations

import torch

from precsearch.arch.config import ModelConfig

_BLOCK_PAIRS = (  # (probe suffix, HF suffix) of the tensors that are renamed only
    ("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"),
    ("self_attention.linear_proj.weight", "self_attn.o_proj.weight"),
    ("mlp.linear_fc1.layer_norm_weight", "post_attention_layernorm.weight"),
    ("mlp.linear_fc2.weight", "mlp.down_proj.weight"),
)
_TOP_PAIRS = (
    ("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
    ("decoder.final_layernorm.weight", "model.norm.weight"),
    ("output_layer.weight", "lm_head.weight"),
)


def _qkv_view(cfg: ModelConfig, w: torch.Tensor) -> torch.Tensor:
    per_group = cfg.n_heads // cfg.n_kv_heads
    return w.view(cfg.n_kv_heads, per_group + 2, cfg.head_dim, w.shape[-1])


def split_qkv_weight(cfg: ModelConfig, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's grouped ``linear_qkv`` weight -> HF ``q_proj``, ``k_proj``, ``v_proj`` weights."""
    grouped = _qkv_view(cfg, w)
    per_group = cfg.n_heads // cfg.n_kv_heads
    dim_in = w.shape[-1]
    q = grouped[:, :per_group].reshape(cfg.n_heads * cfg.head_dim, dim_in)
    k = grouped[:, per_group].reshape(cfg.n_kv_heads * cfg.head_dim, dim_in)
    v = grouped[:, per_group + 1].reshape(cfg.n_kv_heads * cfg.head_dim, dim_in)
    return q, k, v


def fuse_qkv_weight(cfg: ModelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """HF ``q_proj``, ``k_proj``, ``v_proj`` weights -> Megatron's grouped ``linear_qkv`` weight."""
    per_group, hd, dim_in = cfg.n_heads // cfg.n_kv_heads, cfg.head_dim, q.shape[-1]
    parts = (q.view(cfg.n_kv_heads, per_group, hd, dim_in), k.view(cfg.n_kv_heads, 1, hd, dim_in),
             v.view(cfg.n_kv_heads, 1, hd, dim_in))
    return torch.cat(parts, dim=1).reshape(-1, dim_in)


def to_hf(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A probe state dict -> the ``LlamaForCausalLM`` state dict of the same weights."""
    out = {hf: state[ours] for ours, hf in _TOP_PAIRS}
    for i in range(cfg.n_layers):
        ours, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        out |= {hf + h: state[ours + o] for o, h in _BLOCK_PAIRS}
        q, k, v = split_qkv_weight(cfg, state[ours + "self_attention.linear_qkv.weight"])
        out |= {hf + "self_attn.q_proj.weight": q, hf + "self_attn.k_proj.weight": k,
                hf + "self_attn.v_proj.weight": v}
        gate, up = state[ours + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out |= {hf + "mlp.gate_proj.weight": gate, hf + "mlp.up_proj.weight": up}
    return {k: v.contiguous() for k, v in out.items()}


def from_hf(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``LlamaForCausalLM`` state dict -> the probe's (``lm_head`` must be untied, i.e. present).

    Raises:
        KeyError: naming the first Hugging Face tensor the probe needs and ``state`` lacks.
    """
    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise KeyError(f"Hugging Face tensor {name!r} is missing from the checkpoint")
        return state[name]

    out = {ours: get(hf) for ours, hf in _TOP_PAIRS}
    for i in range(cfg.n_layers):
        ours, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        out |= {ours + o: get(hf + h) for o, h in _BLOCK_PAIRS}
        qkv = [get(f"{hf}self_attn.{p}_proj.weight") for p in "qkv"]
        out[ours + "self_attention.linear_qkv.weight"] = fuse_qkv_weight(cfg, *qkv)
        fc1 = (get(hf + "mlp.gate_proj.weight"), get(hf + "mlp.up_proj.weight"))
        out[ours + "mlp.linear_fc1.weight"] = torch.cat(fc1, dim=0)
    return out
