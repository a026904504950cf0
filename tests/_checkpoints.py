"""Tiny Hugging Face Llama checkpoints that tests write themselves (imported by tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

#: Sizes of the tiny checkpoint: GQA (4 query heads, 2 KV heads), Llama 3.1 RoPE scaling, 5 blocks.
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=5, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def hf_llama(seed: int = 0, **overrides):
    """A float32 ``LlamaForCausalLM`` of :data:`TINY` sizes with non-trivial norms (seeded)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(**(TINY | {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": False,
                                              "attn_implementation": "eager"} | overrides))
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # norms of 1 would hide a norm taken from the wrong block
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


def save_checkpoint(model, directory: Path, shard: str | None = None) -> Path:
    """``model.save_pretrained`` to ``directory`` (sharded at ``shard``, e.g. ``"40KB"``)."""
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory
