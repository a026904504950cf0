"""Llama 3 shapes: the sizes of a model, its RoPE scaling, and the published presets.

Data only: nothing here builds a module, so a search space can name and check a
model far too large to instantiate on this machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch only where the frequencies are computed: the CLI's start-up reads shapes only
    import torch


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


def unsplittable(cfg: ModelConfig, size: int) -> str | None:
    """The first of the model's dimensions that ``size`` tensor-parallel ranks cannot split evenly (heads,
    KV heads, FFN rows, vocabulary), or None."""
    return next((name for name in ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
                 if getattr(cfg, name) % size), None)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies (float32, ``head_dim // 2``), with Llama 3.1 scaling if set."""
    import torch

    dim = cfg.head_dim
    # Same arithmetic as HF (int64 arange cast to float32) so the values match bit for bit.
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    if cfg.rope_scaling is None:
        return inv_freq
    return _scale_inv_freq(inv_freq, cfg.rope_scaling)


def _scale_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: stretch long wavelengths, keep short ones, blend in between."""
    import torch

    old_len = s.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    stretched = torch.where(wavelen > old_len / s.low_freq_factor, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * stretched / s.factor + smooth * stretched
    is_medium = (wavelen >= old_len / s.high_freq_factor) & (wavelen <= old_len / s.low_freq_factor)
    return torch.where(is_medium, blended, stretched)
