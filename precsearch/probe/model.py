"""The Llama 3 probe model.

A plain PyTorch Llama 3 whose module and parameter names are exactly those of
Hugging Face's ``LlamaForCausalLM`` (``model.layers.{i}.self_attn.q_proj`` and
so on), so that:

* a policy found on the probe names the same layers as the real model;
* state dicts load into ``LlamaForCausalLM`` unchanged (``strict=True``);
* a numeric backend can swap any projection for another module by name,
  because every projection is a plain ``nn.Linear`` called as a module.

RoPE uses Hugging Face's half-split layout (``rotate_half``) and the Llama 3.1
frequency scaling (HF ``rope_type: llama3``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: HF ``initializer_range`` for Llama: std of the normal init of every weight matrix.
INIT_STD = 0.02

_ATTN_PROJS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PROJS = ("gate_proj", "up_proj", "down_proj")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)(?:\.|$)")


def _require_positive(owner: str, values: Mapping[str, float]) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}.{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1 RoPE frequency scaling (HF ``rope_type: llama3``).

    Wavelengths shorter than ``original_max_position_embeddings / high_freq_factor``
    are kept, those longer than ``original_max_position_embeddings / low_freq_factor``
    are stretched by ``factor``, and the ones in between are interpolated.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _require_positive("rope_scaling", dataclasses.asdict(self))
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                "rope_scaling.high_freq_factor must be greater than low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )

    def to_hf(self, rope_theta: float) -> dict[str, Any]:
        """The equivalent Hugging Face ``rope_parameters`` dict."""
        return {"rope_type": "llama3", "rope_theta": rope_theta, **dataclasses.asdict(self)}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Sizes of a Llama 3 model (the fields of HF ``LlamaConfig`` that matter).

    ``rope_scaling`` may also be given as a mapping (e.g. from YAML); it is
    converted to :class:`RopeScaling`.
    """

    vocab_size: int = 128256
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None
    max_seq_len: int = 8192

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, Mapping):
            # Frozen dataclass: object.__setattr__ is the documented way in __post_init__.
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        sizes = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len")
        _require_positive("model", {n: getattr(self, n) for n in sizes})
        _require_positive("model", {"norm_eps": self.norm_eps, "rope_theta": self.rope_theta})
        if self.dim % self.n_heads:
            raise ValueError(f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            # RoPE rotates pairs of channels.
            raise ValueError(f"model.dim / model.n_heads must be even for RoPE, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.dim // self.n_heads

    def with_overrides(self, **overrides: Any) -> ModelConfig:
        """A validated copy with some fields replaced.

        Raises:
            ValueError: an unknown field name or an invalid resulting config.
        """
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"model.{unknown[0]} is not a model field; valid: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **overrides)

    def num_params(self) -> int:
        """Exact parameter count of :class:`Llama3` (untied head), from the sizes alone."""
        kv_dim = self.n_kv_heads * self.head_dim
        attn = 2 * self.dim * self.dim + 2 * self.dim * kv_dim  # q, o and k, v
        mlp = 3 * self.dim * self.ffn_dim
        block = attn + mlp + 2 * self.dim  # + two RMSNorm weights
        return 2 * self.vocab_size * self.dim + self.n_layers * block + self.dim


_LLAMA31_SCALING = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
_LLAMA32_SCALING = dataclasses.replace(_LLAMA31_SCALING, factor=32.0)

#: Published Llama 3.x sizes (HF ``config.json``) plus a CPU-sized byte-level model.
PRESETS: dict[str, ModelConfig] = {
    "llama3-8b": ModelConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, rope_scaling=_LLAMA31_SCALING
    ),
    "llama3-70b": ModelConfig(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, rope_scaling=_LLAMA31_SCALING
    ),
    "llama3.2-1b": ModelConfig(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, rope_scaling=_LLAMA32_SCALING
    ),
    "llama3.2-3b": ModelConfig(
        dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192, rope_scaling=_LLAMA32_SCALING
    ),
    "tiny": ModelConfig(
        vocab_size=256,  # byte-level text
        dim=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=384,
        max_seq_len=512,
        rope_scaling=_LLAMA31_SCALING,
    ),
}


def linear_layer_names(cfg: ModelConfig) -> list[str]:
    """Fully qualified names of every ``nn.Linear`` of :class:`Llama3`, in module order.

    Computed from the config alone, so a search space can be built for a model
    too large to instantiate here.
    """
    names = []
    for i in range(cfg.n_layers):
        names += [f"model.layers.{i}.self_attn.{p}" for p in _ATTN_PROJS]
        names += [f"model.layers.{i}.mlp.{p}" for p in _MLP_PROJS]
    return names + ["lm_head"]


def layer_index(name: str) -> int | None:
    """The decoder block index of ``model.layers.{i}...``; None for anything else (``lm_head``)."""
    match = _LAYER_RE.match(name)
    return int(match.group(1)) if match else None


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies (float32, ``head_dim // 2``), with Llama 3.1 scaling if set."""
    dim = cfg.head_dim
    # Same arithmetic as HF (int64 arange cast to float32) so the values match bit for bit.
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    if cfg.rope_scaling is None:
        return inv_freq
    return _scale_inv_freq(inv_freq, cfg.rope_scaling)


def _scale_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: stretch long wavelengths, keep short ones, blend in between."""
    old_len = s.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    stretched = torch.where(wavelen > old_len / s.low_freq_factor, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * stretched / s.factor + smooth * stretched
    is_medium = (wavelen >= old_len / s.high_freq_factor) & (wavelen <= old_len / s.low_freq_factor)
    return torch.where(is_medium, blended, stretched)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32 (as HF), scaled by ``weight``."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension; returns the input dtype times ``weight``."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Holds the inverse frequencies; gives cos/sin for positions ``0..T-1``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Non-persistent, like HF: derived from the config, not part of the state dict.
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def reset_inv_freq(self) -> None:
        """Recompute ``inv_freq`` (after ``to_empty`` from the meta device)."""
        self.inv_freq = rope_inv_freq(self.cfg).to(self.inv_freq.device)

    def forward(self, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of shape ``(seq_len, head_dim)`` in ``dtype``."""
        positions = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        # Elementwise product (not matmul) so autocast cannot lower it to bf16.
        freqs = positions[:, None] * self.inv_freq.float()[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(B, heads, T, head_dim)`` by the position angles."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE (HF ``LlamaAttention`` names)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def _heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Self-attention over ``x`` of shape ``(B, T, dim)``."""
        q = self._heads(self.q_proj(x), self.n_heads)
        k = self._heads(self.k_proj(x), self.n_kv_heads)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa repeats each kv head over consecutive query heads, as HF's repeat_kv.
        gqa = self.n_kv_heads != self.n_heads
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the feed-forward to ``x`` of shape ``(B, T, dim)``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One pre-norm transformer block (HF ``LlamaDecoderLayer`` names)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # Registration order fixes named_modules order: attention before MLP, as in HF.
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Residual attention then residual MLP."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama3Model(nn.Module):
    """The decoder stack (HF ``LlamaModel``): embeddings, blocks, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``(B, T, dim)`` for token ids ``(B, T)``."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(input_ids.shape[1], x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Llama3(nn.Module):
    """Llama 3 causal LM with HF ``LlamaForCausalLM`` module names and an untied head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Llama3Model(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    @staticmethod
    def linear_names(cfg: ModelConfig) -> list[str]:
        """Same as :func:`linear_layer_names`."""
        return linear_layer_names(cfg)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, T, vocab)``, or the mean cross-entropy (float32) when ``targets`` is given.

        Args:
            input_ids: token ids ``(B, T)``, ``T <= cfg.max_seq_len``.
            targets: next-token ids ``(B, T)``; ``-100`` entries are ignored.
        """
        if input_ids.shape[1] > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {input_ids.shape[1]} > max_seq_len {self.cfg.max_seq_len}")
        logits = self.lm_head(self.model(input_ids))
        if targets is None:
            return logits
        # float32 log-softmax: bf16 CE is too coarse to compare precision policies.
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def init_weights(model: Llama3, seed: int) -> None:
    """Deterministic HF-style init: weights ~ N(0, 0.02), norm weights = 1.

    Draws in module order from one generator on the model's device, so two
    models built with the same seed on the same device are identical.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, INIT_STD, generator=gen)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
    model.model.rotary_emb.reset_inv_freq()


def build_model(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> Llama3:
    """Build :class:`Llama3` on ``device`` and initialise it with :func:`init_weights`."""
    with torch.device(device):
        model = Llama3(cfg)
    init_weights(model, seed)
    return model


__all__ = [
    "PRESETS",
    "Llama3",
    "ModelConfig",
    "RopeScaling",
    "build_model",
    "init_weights",
    "layer_index",
    "linear_layer_names",
    "rope_inv_freq",
]
