"""Precision units: the modules a policy assigns a precision to.

A unit is one GEMM module of the training stack users run: Megatron-Core's
Llama 3 layout on Transformer Engine's fused modules. Per decoder block:

========================================  =================================  ======================
unit (canonical name)                     Hugging Face names it computes     TE module
========================================  =================================  ======================
``decoder.layers.{i}.self_attention.linear_qkv``  ``model.layers.{i}.self_attn.{q,k,v}_proj``  ``LayerNormLinear`` (RMSNorm fused)
``decoder.layers.{i}.self_attention.linear_proj`` ``model.layers.{i}.self_attn.o_proj``        ``Linear``
``decoder.layers.{i}.mlp.linear_fc1``             ``model.layers.{i}.mlp.{gate,up}_proj``       ``LayerNormLinear`` / ``LayerNormMLP``
``decoder.layers.{i}.mlp.linear_fc2``             ``model.layers.{i}.mlp.down_proj``            ``Linear`` / ``LayerNormMLP``
========================================  =================================  ======================

and ``output_layer`` (Hugging Face ``lm_head``). A fused module computes several
Hugging Face projections in one GEMM, so they cannot run in different
precisions: space files and policies may name units by either scheme (the
Hugging Face names are aliases), and asking for two precisions inside one unit
is an error (:func:`precsearch.policy.rules.Policy.precision_for`).
"""

from __future__ import annotations

import re

from precsearch.arch.config import ModelConfig

OUTPUT_LAYER = "output_layer"
HF_OUTPUT_LAYER = "lm_head"
#: A policy pattern matching every unit of every transformer block (not the output layer).
BLOCKS_PATTERN = "decoder.layers.*"

#: Unit suffix inside a block -> the Hugging Face projection suffixes it computes.
BLOCK_UNITS: dict[str, tuple[str, ...]] = {
    "self_attention.linear_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.linear_proj": ("self_attn.o_proj",),
    "mlp.linear_fc1": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.linear_fc2": ("mlp.down_proj",),
}
#: Units whose input RMSNorm is fused into the GEMM module (TE ``LayerNormLinear``): their input is the
#: normalised residual stream.
NORMED_UNITS = ("self_attention.linear_qkv", "mlp.linear_fc1")
#: The Hugging Face projections of one block (``self_attn.q_proj`` ...), in module order.
HF_BLOCK_PROJS: tuple[str, ...] = tuple(hf for hfs in BLOCK_UNITS.values() for hf in hfs)

_HF_TO_UNIT = {hf: unit for unit, hfs in BLOCK_UNITS.items() for hf in hfs}
_UNIT_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_HF_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def unit_names(cfg: ModelConfig) -> list[str]:
    """Every unit of a model of shape ``cfg``, in execution order (blocks, then ``output_layer``)."""
    names = [f"decoder.layers.{i}.{suffix}" for i in range(cfg.n_layers) for suffix in BLOCK_UNITS]
    return names + [OUTPUT_LAYER]


def hf_linear_names(n_layers: int) -> list[str]:
    """Every Linear of a Llama 3 with ``n_layers`` blocks, Hugging Face names, in module order."""
    return [f"model.layers.{i}.{hf}" for i in range(n_layers) for hf in HF_BLOCK_PROJS] + [HF_OUTPUT_LAYER]


def unit_of(name: str) -> str | None:
    """The canonical unit computing ``name`` (a unit name or a Hugging Face alias), else None."""
    if name == OUTPUT_LAYER or name == HF_OUTPUT_LAYER:
        return OUTPUT_LAYER
    if (m := _UNIT_RE.match(name)) and m.group(2) in BLOCK_UNITS:
        return name
    if (m := _HF_RE.match(name)) and m.group(2) in _HF_TO_UNIT:
        return f"decoder.layers.{m.group(1)}.{_HF_TO_UNIT[m.group(2)]}"
    return None


def layer_names(name: str) -> tuple[str, ...]:
    """Every name a policy pattern may use for layer ``name``: the name, its unit's canonical name and the
    unit's Hugging Face names (``lm_head`` for ``output_layer``); the one place aliases are resolved.

    A name that is no precision unit (a custom model's module) answers to itself only.
    """
    unit = unit_of(name)
    if unit is None:
        return (name,)
    return tuple(dict.fromkeys((name, unit, *hf_names(unit))))


def hf_names(unit: str) -> tuple[str, ...]:
    """The Hugging Face module names a unit computes (``linear_qkv`` -> q, k and v projections).

    Raises:
        ValueError: ``unit`` is not a canonical unit name.
    """
    if unit == OUTPUT_LAYER:
        return (HF_OUTPUT_LAYER,)
    m = _UNIT_RE.match(unit)
    if not m or m.group(2) not in BLOCK_UNITS:
        raise ValueError(f"{unit!r} is not a precision unit; units look like decoder.layers.0.mlp.linear_fc1")
    return tuple(f"model.layers.{m.group(1)}.{hf}" for hf in BLOCK_UNITS[m.group(2)])


def unit_kind(unit: str) -> str:
    """``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2`` or ``output_layer``."""
    return unit.rsplit(".", 1)[-1]


def is_normed(unit: str) -> bool:
    """Whether the unit's module applies the block's RMSNorm to its input (TE ``LayerNormLinear``)."""
    return any(unit.endswith(suffix) for suffix in NORMED_UNITS)


def unit_shape(cfg: ModelConfig, unit: str) -> tuple[int, int]:
    """``(in_features, out_features)`` of a unit's GEMM."""
    kv_dim = cfg.n_kv_heads * cfg.head_dim
    shapes = {
        "linear_qkv": (cfg.dim, cfg.dim + 2 * kv_dim),
        "linear_proj": (cfg.dim, cfg.dim),
        "linear_fc1": (cfg.dim, 2 * cfg.ffn_dim),
        "linear_fc2": (cfg.ffn_dim, cfg.dim),
        "output_layer": (cfg.dim, cfg.vocab_size),
    }
    return shapes[unit_kind(unit)]
