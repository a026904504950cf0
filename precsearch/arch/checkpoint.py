"""``model.init_from``, whatever its format: a Hugging Face checkpoint directory or a GGUF file.

The two readers give the same things (a :class:`ModelConfig` of the full model,
the probe's tensors under Hugging Face names, checked against it); this module
picks the reader from the path, so validation and the probe never ask which
format they hold. Loading the weights is the probe's
(:mod:`precsearch.probe.model.checkpoint_init`).
"""

from __future__ import annotations

from pathlib import Path

from precsearch.arch import gguf_checkpoint, hf_checkpoint
from precsearch.arch.config import ModelConfig
from precsearch.arch.hf_checkpoint import TensorInfo


def read_config(path: Path) -> ModelConfig:
    """The full model's shape: a checkpoint directory's ``config.json`` or a GGUF file's metadata.

    Raises:
        UserError: naming ``model.init_from``, the file and the field (see the two readers).
    """
    reader = gguf_checkpoint if gguf_checkpoint.is_gguf(path) else hf_checkpoint
    return reader.read_config(path)


def check_checkpoint(path: Path, layers: tuple[int, ...]) -> dict[str, TensorInfo]:
    """The tensors the probe takes (blocks ``layers``), by Hugging Face name, checked to exist with the
    config's shape in a dtype the reader can load.

    Raises:
        UserError: naming ``model.init_from``, the file and the tensor.
    """
    reader = gguf_checkpoint if gguf_checkpoint.is_gguf(path) else hf_checkpoint
    return reader.check_checkpoint(path, layers)


__all__ = ["check_checkpoint", "read_config"]
