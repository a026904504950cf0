"""The ``model`` section of a space file: the target Llama 3 (a preset, explicit dims or a checkpoint)
and the probe cut from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from precsearch.arch.checkpoint import read_config
from precsearch.arch.hf_checkpoint import CheckpointStart, LayerPick, pick_layers
from precsearch.config.section import Section
from precsearch.arch.config import PRESETS, ModelConfig
from precsearch.utils.numbers import MAX_LAYERS


class ModelSection(Section):
    """The target model (a Llama 3 preset, explicit dims, or a checkpoint) and the probe's overrides.

    The probe has the target's architecture with fewer layers (``probe_layers``);
    every other dimension is the target's unless overridden here. With
    ``init_from`` the target is the checkpoint's full model (its ``config.json`` or GGUF metadata),
    the probe starts from its weights, and ``probe_layer_pick`` says which of its
    blocks the probe takes (:mod:`precsearch.arch.checkpoint`).
    """

    preset: str | None = "tiny"
    # upper bounds far above any Llama (405B: 126 layers, dim 16384, ffn 53248, vocab 128256) keep a typo
    # from making `validate` enumerate a billion layer names
    vocab_size: int | None = Field(None, gt=0, le=2**24)
    dim: int | None = Field(None, gt=0, le=2**20)
    n_layers: int | None = Field(None, gt=0, le=MAX_LAYERS)
    n_heads: int | None = Field(None, gt=0, le=2**16)
    n_kv_heads: int | None = Field(None, gt=0, le=2**16)
    ffn_dim: int | None = Field(None, gt=0, le=2**22)
    rope_theta: float | None = Field(None, gt=0)
    probe_layers: int | None = Field(None, gt=0, le=MAX_LAYERS, description="layers in the probe (default: all)")
    init_from: Path | None = Field(None, description="a local Llama checkpoint: a Hugging Face directory "
                                   "(config.json + safetensors) or a GGUF file; the probe starts from its weights "
                                   "and the target is its shape")
    probe_layer_pick: LayerPick | None = Field(
        None, description="with init_from: which blocks the probe takes: first (the default), last or spread "
        "(evenly spaced, first and last included)")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset '{v}'; valid: {', '.join(PRESETS)}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _no_default_preset_with_checkpoint(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("init_from") is not None and "preset" not in data:
            data = {**data, "preset": None}  # the checkpoint's config.json gives the shape, not the default preset
        return data

    @model_validator(mode="after")
    def _checkpoint_gives_shape(self) -> "ModelSection":
        if self.init_from is None:
            if self.probe_layer_pick is not None:
                raise ValueError("probe_layer_pick chooses blocks of a checkpoint; it needs init_from")
            return self
        given = [k for k in ("preset", *_DIM_FIELDS) if getattr(self, k) is not None]
        if given:
            raise ValueError(f"with init_from the checkpoint (config.json or GGUF metadata) gives the model's shape; "
                             f"remove {', '.join(given)}")
        return self

    def target(self) -> ModelConfig:
        """The full model the policy is meant for (the checkpoint's, with ``init_from``).

        Raises:
            ValueError: explicit dims that do not make a model.
            UserError: an unreadable or non-Llama checkpoint ``config.json`` or GGUF file (field
                ``model.init_from``).
        """
        if self.init_from is not None:
            return read_config(self.init_from)
        dims = {k: getattr(self, k) for k in _DIM_FIELDS if getattr(self, k) is not None}
        if self.preset is None:
            missing = [k for k in _REQUIRED_DIMS if k not in dims]
            if missing:
                raise ValueError(f"without a preset, give {', '.join(missing)}")
            return ModelConfig(**dims)
        return PRESETS[self.preset].with_overrides(**dims)

    def probe(self) -> ModelConfig:
        """The probe: the target with ``probe_layers`` layers."""
        target = self.target()
        if self.probe_layers is None:
            return target
        return target.with_overrides(n_layers=min(self.probe_layers, target.n_layers))

    def start(self) -> CheckpointStart | None:
        """The checkpoint and its blocks the probe starts from, or None for a random init."""
        if self.init_from is None:
            return None
        total = self.target().n_layers
        layers = pick_layers(total, min(self.probe_layers or total, total), self.probe_layer_pick or LayerPick.FIRST)
        return CheckpointStart(self.init_from, layers)


_DIM_FIELDS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "rope_theta")
_REQUIRED_DIMS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim")
