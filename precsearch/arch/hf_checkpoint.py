"""A local Hugging Face Llama checkpoint, read as data: its shape, its tensor list, which blocks a probe takes.

Nothing here loads a weight or builds a module. :func:`read_config` turns the
checkpoint's ``config.json`` into a :class:`ModelConfig` (hidden size, heads,
GQA KV heads, FFN size, vocabulary, RoPE theta and Llama 3 ``rope_scaling``,
RMSNorm eps, context length); :func:`tensor_index` lists every tensor's name,
dtype and shape from the ``.safetensors`` headers (a few KiB read per shard,
single file or sharded with ``model.safetensors.index.json``); and
:func:`check_checkpoint` verifies that every tensor the probe will take is
there with the shape the config implies. Each failure is a
:class:`~precsearch.errors.UserError` naming the file and the tensor or field,
raised when the space is validated, before any probe runs.

Megatron-Core ``torch_dist`` checkpoints (a ``.metadata`` file and
``*.distcp`` shards) are recognised and refused with a clear message: reading
them needs Megatron's sharded-state-dict metadata, not supported yet.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any


from precsearch.arch.config import ModelConfig, RopeScaling
from precsearch.errors import UserError
from precsearch.utils.json_io import read_json_object

FIELD = "model.init_from"
CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
#: HF ``architectures`` / ``model_type`` values read as Llama (Llama 2, 3, 3.1, 3.2 all use them).
LLAMA_ARCHITECTURES = ("LlamaForCausalLM",)
#: safetensors dtypes a weight may be stored in.
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
#: Bytes per element of the safetensors dtypes whose data size a header check verifies.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class LayerPick(str, Enum):
    """Which of a checkpoint's blocks a probe of ``probe_layers`` blocks takes."""

    FIRST = "first"  # blocks 0 .. n-1: the start of the network, as a probe of a random init
    LAST = "last"  # the final n blocks: where trained outliers and large amax usually grow
    SPREAD = "spread"  # n blocks evenly spaced over the depth, first and last included


def pick_layers(total: int, n: int, pick: LayerPick) -> tuple[int, ...]:
    """Indices of the ``n`` blocks (of ``total``) a probe takes, in depth order.

    ``spread`` rounds ``linspace(0, total - 1, n)``, so it always holds the first and
    the last block (for ``n >= 2``) and never repeats one.
    """
    if not 1 <= n <= total:
        raise ValueError(f"probe_layers {n} must lie in 1..{total}")
    if pick is LayerPick.FIRST:
        return tuple(range(n))
    if pick is LayerPick.LAST:
        return tuple(range(total - n, total))
    if n == 1:
        return (0,)
    return tuple(int(round(i * (total - 1) / (n - 1))) for i in range(n))


@dataclass(frozen=True)
class CheckpointStart:
    """Where a probe's weights come from: a checkpoint directory and the blocks taken from it.

    Attributes:
        path: The Hugging Face checkpoint directory.
        layers: The checkpoint's block indices, in order; probe block ``j`` gets block ``layers[j]``.
    """

    path: Path
    layers: tuple[int, ...]


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lies and what the header says of it."""

    file: Path
    dtype: str
    shape: tuple[int, ...]


def _error(path: Path, message: str) -> UserError:
    return UserError(f"{path}: {message}", field=FIELD)


def _json(path: Path) -> dict[str, Any]:
    return read_json_object(path, _error)


def _refuse_torch_dist(path: Path) -> None:
    if (path / ".metadata").is_file() or any(path.glob("*.distcp")) or (path / "common.pt").is_file():
        raise _error(path, "looks like a Megatron-Core torch_dist checkpoint (.metadata / *.distcp); those are not "
                           "supported yet. Convert it to a Hugging Face checkpoint (config.json + safetensors), "
                           "e.g. with Megatron-Bridge or Megatron-LM's checkpoint converter, and point init_from "
                           "at that directory")


def checkpoint_dir(path: Path) -> Path:
    """``path`` checked to be a directory with a ``config.json``.

    Raises:
        UserError: missing, not a directory, a torch_dist checkpoint, or no config.json.
    """
    path = Path(path)
    if not path.exists():
        raise _error(path, "no such checkpoint directory (nothing is downloaded: give a local directory)")
    if not path.is_dir():
        raise _error(path, "not a directory; give the checkpoint directory holding config.json and *.safetensors")
    _refuse_torch_dist(path)
    if not (path / CONFIG).is_file():
        raise _error(path, f"no {CONFIG}: not a Hugging Face checkpoint directory")
    return path


def read_config(path: Path) -> ModelConfig:
    """The full model's shape from ``config.json`` of a Llama checkpoint directory.

    Raises:
        UserError: naming ``config.json`` and the field that is missing, of another
            architecture, or not what the probe can run (biases, another activation,
            a RoPE type other than default or ``llama3``, ``head_dim`` != hidden/heads).
    """
    file = checkpoint_dir(path) / CONFIG
    raw = _json(file)
    _require_llama(file, raw)

    def need(key: str) -> Any:
        if key not in raw:
            raise _error(file, f"field {key!r} is missing")
        return raw[key]

    heads = need("num_attention_heads")
    theta, scaling = _rope(file, raw)
    try:
        cfg = ModelConfig(vocab_size=need("vocab_size"), dim=need("hidden_size"), n_layers=need("num_hidden_layers"),
                          n_heads=heads, n_kv_heads=raw.get("num_key_value_heads") or heads,
                          ffn_dim=need("intermediate_size"), norm_eps=raw.get("rms_norm_eps", 1e-6),
                          rope_theta=theta, rope_scaling=scaling,
                          max_seq_len=raw.get("max_position_embeddings", 8192))
    except (TypeError, ValueError) as exc:
        raise _error(file, f"not a valid Llama shape: {exc}") from None
    head_dim = raw.get("head_dim")
    if head_dim is not None and head_dim != cfg.head_dim:
        raise _error(file, f"head_dim {head_dim} != hidden_size / num_attention_heads = {cfg.head_dim}; the probe "
                           f"needs head_dim = hidden_size / num_attention_heads")
    return cfg


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` of a ``LlamaForCausalLM`` of shape ``cfg`` (untied head), in the transformers 4
    layout that transformers 5 reads too; :func:`read_config` gives ``cfg`` back."""
    raw = {"architectures": list(LLAMA_ARCHITECTURES), "model_type": "llama", "hidden_act": "silu",
           "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.dim, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
           "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.ffn_dim, "head_dim": cfg.head_dim,
           "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_seq_len}
    if cfg.rope_scaling is not None:
        raw["rope_scaling"] = {k: v for k, v in cfg.rope_scaling.to_hf(cfg.rope_theta).items() if k != "rope_theta"}
    return raw


def _require_llama(file: Path, raw: dict[str, Any]) -> None:
    archs = raw.get("architectures") or []
    model_type = raw.get("model_type")
    if model_type != "llama" or (archs and not set(archs) & set(LLAMA_ARCHITECTURES)):
        raise _error(file, f"model_type {model_type!r}, architectures {archs}: only Llama checkpoints "
                           f"(model_type 'llama', {', '.join(LLAMA_ARCHITECTURES)}) can start a probe")
    for key, valid in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if key in raw and raw[key] != valid:
            raise _error(file, f"field {key!r} is {raw[key]!r}; the Llama 3 probe has {key} {valid!r}")


def _rope(file: Path, raw: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, rope_scaling)`` from the transformers 4 (``rope_theta`` + ``rope_scaling``) or
    5 (``rope_parameters``) layout."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.pop("rope_theta", raw.get("rope_theta", 10000.0))
    kind = params.pop("rope_type", params.pop("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise _error(file, f"rope type {kind!r} is not supported; valid: default, llama3")
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [f for f in fields if f not in params]
    if missing:
        raise _error(file, f"llama3 rope scaling lacks {', '.join(missing)}")
    try:
        return float(theta), RopeScaling(**{f: params[f] for f in fields})
    except (TypeError, ValueError) as exc:
        raise _error(file, f"rope scaling: {exc}") from None


def _shards(path: Path) -> list[Path]:
    index = path / INDEX
    if index.is_file():
        weight_map = _json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise _error(index, "has no 'weight_map'")
        return [path / name for name in sorted(set(weight_map.values()))]
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise _error(path, f"no {SINGLE}, {INDEX} or *.safetensors (pytorch_model.bin is not read: save with "
                           f"safe_serialization=True)")
    return found


def read_header(file: Path) -> dict[str, TensorInfo]:
    """The tensors of one ``.safetensors`` file, from its JSON header only (8 + header bytes read).

    Raises:
        UserError: missing file, bad header, or data offsets past the end (a truncated file).
    """
    if not file.is_file():
        raise _error(file, "shard named in the index is missing")
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise _error(file, "not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise _error(file, f"bad safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise _error(file, f"bad safetensors header: a JSON {type(header).__name__}, expected an object")
    out, end = {}, 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            info = TensorInfo(file, str(meta["dtype"]), tuple(int(d) for d in meta["shape"]))
            begin, stop = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _error(file, f"bad safetensors header entry for tensor {name!r} (needs dtype, shape and "
                               f"data_offsets [begin, end]): {exc!r}") from None
        if not 0 <= begin <= stop:
            raise _error(file, f"tensor {name!r} has data_offsets [{begin}, {stop}]: a corrupt header")
        width = DTYPE_BYTES.get(info.dtype)
        if width is not None and stop - begin != width * math.prod(info.shape):
            raise _error(file, f"tensor {name!r}: {info.dtype} {list(info.shape)} needs "
                               f"{width * math.prod(info.shape)} bytes, its data_offsets span {stop - begin}: "
                               f"a corrupt header")
        out[name] = info
        end = max(end, stop)
    if 8 + n + end > size:
        raise _error(file, f"truncated: the header needs {8 + n + end} bytes, the file has {size}")
    return out


def tensor_index(path: Path) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint in directory ``path``, name -> :class:`TensorInfo`."""
    path = checkpoint_dir(path)
    out: dict[str, TensorInfo] = {}
    for shard in _shards(path):
        out |= read_header(shard)
    return out


def expected_shapes(cfg: ModelConfig, layers: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape, for the embedding, final norm, ``lm_head`` and ``layers``."""
    kv = cfg.n_kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.dim), "model.norm.weight": (cfg.dim,),
           "lm_head.weight": (cfg.vocab_size, cfg.dim)}
    block = {"input_layernorm.weight": (cfg.dim,), "post_attention_layernorm.weight": (cfg.dim,),
             "self_attn.q_proj.weight": (cfg.dim, cfg.dim), "self_attn.k_proj.weight": (kv, cfg.dim),
             "self_attn.v_proj.weight": (kv, cfg.dim), "self_attn.o_proj.weight": (cfg.dim, cfg.dim),
             "mlp.gate_proj.weight": (cfg.ffn_dim, cfg.dim), "mlp.up_proj.weight": (cfg.ffn_dim, cfg.dim),
             "mlp.down_proj.weight": (cfg.dim, cfg.ffn_dim)}
    for i in layers:
        out |= {f"model.layers.{i}.{k}": v for k, v in block.items()}
    return out


def tied_embeddings(path: Path) -> bool:
    """Whether ``config.json`` ties ``lm_head`` to the embedding (then ``lm_head.weight`` may be absent)."""
    return bool(_json(checkpoint_dir(path) / CONFIG).get("tie_word_embeddings", False))


def check_checkpoint(path: Path, layers: tuple[int, ...]) -> dict[str, TensorInfo]:
    """Check that every tensor the probe takes exists with the right shape and a float dtype.

    Returns the index of those tensors (``lm_head.weight`` points at the embedding when tied).

    Raises:
        UserError: naming the tensor (and its file) that is missing, misshapen or not a float.
    """
    cfg = read_config(path)
    index = tensor_index(path)
    if "lm_head.weight" not in index and tied_embeddings(path) and "model.embed_tokens.weight" in index:
        index["lm_head.weight"] = index["model.embed_tokens.weight"]
    needed: dict[str, TensorInfo] = {}
    for name, shape in expected_shapes(cfg, layers).items():
        info = index.get(name)
        if info is None:
            raise _error(Path(path), f"tensor {name!r} is missing from the checkpoint")
        if info.shape != shape:
            raise _error(info.file, f"tensor {name!r} has shape {list(info.shape)}, config.json implies {list(shape)}")
        if info.dtype not in FLOAT_DTYPES:
            raise _error(info.file, f"tensor {name!r} is {info.dtype}; valid: {', '.join(FLOAT_DTYPES)}")
        needed[name] = info
    return needed


__all__ = ["CheckpointStart", "LayerPick", "TensorInfo", "check_checkpoint", "expected_shapes", "hf_config", "pick_layers", "read_config",
           "read_header", "tensor_index", "tied_embeddings"]
