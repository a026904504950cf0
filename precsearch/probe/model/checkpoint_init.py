"""Start a probe from a trained checkpoint: the embedding, final norm, output layer and chosen blocks.

:func:`load_start` reads, lazily with ``safetensors.safe_open``, only the
tensors the probe takes (never a whole shard), or dequantises them from a GGUF
file (:mod:`precsearch.arch.gguf_checkpoint`), renumbers the chosen blocks
``layers[j] -> j``, and converts them to the probe's Megatron-Core layout with
:func:`precsearch.probe.model.hf_weights.from_hf` (exact: a permutation and a
concatenation). A checkpoint with tied embeddings gives its embedding to the
output layer too; the probe then trains the two as separate weights, as it
always does. Optimizer state starts fresh (AdamW moments at zero).
"""

from __future__ import annotations

import torch
from torch import nn

from precsearch.arch.config import ModelConfig
from precsearch.arch import gguf_checkpoint
from precsearch.arch.checkpoint import check_checkpoint
from precsearch.arch.hf_checkpoint import CheckpointStart, TensorInfo
from precsearch.probe.model.hf_weights import from_hf


def _renumbered(name: str, new_index: dict[int, int]) -> str:
    """``model.layers.{i}.x`` -> ``model.layers.{new_index[i]}.x``; other names unchanged."""
    if not name.startswith("model.layers."):
        return name
    index, rest = name[len("model.layers."):].split(".", 1)
    return f"model.layers.{new_index[int(index)]}.{rest}"


def load_start(start: CheckpointStart, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The probe state dict (float32, CPU) of ``start``'s tensors, for a probe of shape ``cfg``.

    Raises:
        UserError: a tensor is missing or misshapen (:func:`~precsearch.arch.checkpoint.check_checkpoint`).
        ValueError: ``cfg`` has another number of blocks than ``start.layers``.
    """
    if cfg.n_layers != len(start.layers):
        raise ValueError(f"the probe has {cfg.n_layers} blocks but {len(start.layers)} are taken from the checkpoint")
    needed = check_checkpoint(start.path, start.layers)
    if gguf_checkpoint.is_gguf(start.path):
        arrays = gguf_checkpoint.read_tensors(start.path, tuple(needed))
        hf = {name: torch.from_numpy(w) for name, w in arrays.items()}
    else:
        hf = _read_safetensors(needed)
    new_index = {old: new for new, old in enumerate(start.layers)}
    return from_hf(cfg, {_renumbered(name, new_index): w for name, w in hf.items()})


def _read_safetensors(needed: dict[str, TensorInfo]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open  # lazy: only a checkpoint start needs it

    by_file: dict[str, list[str]] = {}
    for name, info in needed.items():
        by_file.setdefault(str(info.file), []).append(name)
    hf: dict[str, torch.Tensor] = {}
    embed = "model.embed_tokens.weight"
    for file, names in by_file.items():
        with safe_open(file, framework="pt", device="cpu") as f:
            stored = set(f.keys())
            for name in names:
                # a tied lm_head points at the embedding's file under the embedding's name
                key = name if name in stored else embed
                hf[name] = f.get_tensor(key).float()
    return hf


def init_from_checkpoint(model: nn.Module, start: CheckpointStart) -> None:
    """Overwrite every weight of the plain probe ``model`` (:class:`~precsearch.probe.model.llama3.Llama3`) with
    ``start``'s, in the model's dtype and on its device."""
    state = load_start(start, model.cfg)
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
