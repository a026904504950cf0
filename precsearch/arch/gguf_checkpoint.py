"""A Llama checkpoint in one GGUF file (llama.cpp's format), read as the Hugging Face checkpoint would be.

A GGUF file holds typed key/value metadata (``general.architecture``,
``llama.embedding_length``, ...), a table of tensors (name, dimensions, GGML
type, offset) and their data, each tensor stored as float32, float16, bfloat16
or in a block-quantised type (``Q8_0``, ``Q4_1``, ``Q4_K``, ...). This module
turns that into what :mod:`precsearch.arch.hf_checkpoint` gives for a
safetensors checkpoint, so everything downstream is shared:

- :func:`read_config`: the full model's :class:`ModelConfig` from the metadata
  (the memory target is the whole model);
- :func:`tensor_index` / :func:`check_checkpoint`: the tensors under their
  Hugging Face names, shapes in PyTorch order (GGUF lists dimensions innermost
  first), checked against the config;
- :func:`read_tensors`: chosen tensors dequantised to float32 numpy arrays, in
  the Hugging Face layout.

The header is parsed here (a few KiB plus the tokenizer's strings); the data is
dequantised by the ``gguf`` package (``pip install 'precsearch[gguf]'``), whose
type table also gives each type's block size. llama.cpp's converter reorders
the rows of each head of ``attn_q`` and ``attn_k`` for its RoPE, which rotates
adjacent pairs (0, 1), (2, 3), ... where Hugging Face Llama rotates the two
halves of a head (i, i + head_dim/2): :func:`read_tensors` restores the Hugging
Face order, an exact permutation. Quantisation works along rows, so the
permutation and the dequantisation commute.

Every failure is a :class:`~precsearch.errors.UserError` naming ``model.init_from``,
the file and the tensor or metadata key, raised while the space is validated.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from precsearch.arch.config import ModelConfig
from precsearch.arch.hf_checkpoint import FIELD, TensorInfo, expected_shapes
from precsearch.errors import UserError

SUFFIX = ".gguf"
MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 (2023, 32-bit counts) predates every Llama 3 file
ARCHITECTURE = "llama"
EXTRA = "pip install 'precsearch[gguf]' (the gguf package dequantises GGUF tensors)"
#: GGML types a weight may be stored in (float and llama.cpp's common block quantisations).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                   "Q6_K")
#: GGUF tensor name -> Hugging Face ``LlamaForCausalLM`` name; ``{i}`` is the block.
HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_GGUF_NAMES = {hf: name for name, hf in HF_NAMES.items()}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_HF_BLOCK = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
#: struct formats of GGUF's scalar metadata types (GGUFValueType 0..12 but STRING=8 and ARRAY=9).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def is_gguf(path: Path) -> bool:
    """Whether ``model.init_from`` names a GGUF file (by its suffix, or by its magic for a file)."""
    path = Path(path)
    if path.suffix.lower() == SUFFIX:
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


def _error(path: Path, message: str) -> UserError:
    return UserError(f"{path}: {message}", field=FIELD)


def _gguf(path: Path) -> Any:
    try:
        import gguf  # optional: only a GGUF checkpoint needs it
    except ImportError:
        raise _error(path, f"reading a GGUF checkpoint needs the gguf package: {EXTRA}") from None
    return gguf


@dataclass(frozen=True)
class GGUFTensorInfo(TensorInfo):
    """A GGUF tensor: :class:`TensorInfo` (shape in PyTorch order, ``dtype`` the GGML type name) and where
    its bytes lie."""

    gguf_name: str
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file's header says: its metadata (an array as its length) and its tensors by GGUF name."""

    file: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]


@dataclass(frozen=True)
class _Array:
    """A metadata array, kept as its length."""

    length: int


class _Cursor:
    """Reads the header's little-endian fields; running out of bytes is a truncated file."""

    def __init__(self, f: BinaryIO, file: Path, size: int):
        self.f, self.file, self.size = f, file, size

    def _have(self, n: int, what: str) -> None:
        # checked before reading, so that a corrupt count never makes a huge allocation
        if self.f.tell() + n > self.size:
            raise _error(self.file, f"truncated in its header (while reading {what})")

    def take(self, n: int, what: str) -> bytes:
        self._have(n, what)
        return self.f.read(n)

    def skip(self, n: int, what: str) -> None:
        self._have(n, what)
        self.f.seek(n, 1)

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        return self.take(n, what).decode("utf-8", errors="replace")

    def value(self, kind: int, key: str) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], f"metadata {key!r}")
        if kind == _STRING:
            return self.string(f"metadata {key!r}")
        if kind != _ARRAY:
            raise _error(self.file, f"metadata {key!r} has unknown value type {kind}: a corrupt header")
        item, count = self.unpack("<I", f"metadata {key!r}"), self.unpack("<Q", f"metadata {key!r}")
        if item in _SCALARS:  # skipped: no array but the tokenizer's is long, and only its length is used
            self.skip(count * struct.calcsize(_SCALARS[item]), f"metadata {key!r}")
        else:
            for _ in range(count):
                self.value(item, key)
        return _Array(count)


def _parse(file: Path) -> GGUFHeader:
    gguf = _gguf(file)
    size = file.stat().st_size
    with open(file, "rb") as f:
        cur = _Cursor(f, file, size)
        metadata, table = _header_fields(cur)
        align = metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise _error(file, f"metadata 'general.alignment' is {align!r}; valid: a power of two")
        start = -(-f.tell() // align) * align  # the data begins at the next multiple of the alignment
    tensors = {}
    for name, dims, type_id, offset in table:
        info = _tensor_info(gguf, file, name, dims, type_id, start + offset)
        if info.offset + info.nbytes > size:
            raise _error(file, f"truncated: tensor {name!r} ends at byte {info.offset + info.nbytes}, "
                               f"the file has {size}")
        tensors[name] = info
    return GGUFHeader(file, metadata, tensors)


def _header_fields(cur: _Cursor) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]]]:
    """The metadata and the tensor table ``(name, dims, type id, offset)``, the cursor left at their end."""
    if cur.f.read(4) != MAGIC:
        raise _error(cur.file, "not a GGUF file (its first bytes are not 'GGUF')")
    version = cur.unpack("<I", "the version")
    if version not in VERSIONS:
        raise _error(cur.file, f"GGUF version {version} (or big-endian); valid: little-endian version "
                               f"{' or '.join(map(str, VERSIONS))}")
    n_tensors, n_kv = cur.unpack("<Q", "the tensor count"), cur.unpack("<Q", "the metadata count")
    metadata = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key")
        metadata[key] = cur.value(cur.unpack("<I", f"metadata {key!r}"), key)
    return metadata, [_tensor_entry(cur) for _ in range(n_tensors)]


def _tensor_entry(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string("a tensor name")
    n_dims = cur.unpack("<I", f"tensor {name!r}")
    if n_dims > 8:
        raise _error(cur.file, f"tensor {name!r} has {n_dims} dimensions: a corrupt header")
    dims = tuple(cur.unpack("<Q", f"tensor {name!r}") for _ in range(n_dims))
    return name, dims, cur.unpack("<I", f"tensor {name!r}"), cur.unpack("<Q", f"tensor {name!r}")


def _tensor_info(gguf: Any, file: Path, name: str, dims: tuple[int, ...], type_id: int,
                 offset: int) -> GGUFTensorInfo:
    try:
        kind = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        raise _error(file, f"tensor {name!r} has GGML type id {type_id}, unknown to the installed gguf "
                           f"package; valid: {', '.join(SUPPORTED_TYPES)}") from None
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    if dims and dims[0] % block:
        raise _error(file, f"tensor {name!r}: {kind.name} stores blocks of {block} values, its rows have "
                           f"{dims[0]}: a corrupt header")
    nbytes = math.prod(dims) // block * type_size
    return GGUFTensorInfo(file, kind.name, tuple(reversed(dims)), name, offset, nbytes)


@functools.lru_cache(maxsize=8)
def _cached(file: Path, _mtime_ns: int, _size: int) -> GGUFHeader:
    return _parse(file)


def read_header(path: Path) -> GGUFHeader:
    """The metadata and tensor table of the GGUF file ``path`` (parsed once per file version).

    Raises:
        UserError: a missing file, not a GGUF file, a truncated header or data, an unknown tensor type,
            or the gguf package missing (the message names the pip extra).
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such GGUF file (nothing is downloaded: give a local file)"
        raise _error(path, what)
    stat = path.stat()
    return _cached(path.absolute(), stat.st_mtime_ns, stat.st_size)  # errors name the path as given


def _meta(header: GGUFHeader, key: str, default: Any = None, kind: type = int) -> Any:
    value = header.metadata.get(key, default)
    if value is None:
        raise _error(header.file, f"metadata {key!r} is missing")
    if isinstance(value, (_Array, str, bool)):
        raise _error(header.file, f"metadata {key!r} is {value!r}; the probe needs one {kind.__name__} for all "
                                  f"blocks")
    return kind(value)


def _require_llama(header: GGUFHeader) -> None:
    arch = header.metadata.get("general.architecture")
    if arch != ARCHITECTURE:
        raise _error(header.file, f"general.architecture is {arch!r}: only Llama GGUF files "
                                  f"(general.architecture 'llama') can start a probe")
    parts = header.metadata.get("split.count", 1)
    if parts != 1:
        raise _error(header.file, f"one part of a split GGUF (split.count {parts}); merge the parts into one file "
                                  f"first (llama.cpp's llama-gguf-split --merge)")
    scaling = header.metadata.get("llama.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in header.tensors:
        raise _error(header.file, f"RoPE scaling ({'rope_freqs.weight' if scaling == 'none' else scaling}) is not "
                                  f"read from GGUF yet; start from the Hugging Face checkpoint instead")
    biases = sorted(n for n in header.tensors if n.endswith(".bias"))
    if biases:
        raise _error(header.file, f"tensor {biases[0]!r}: biases; the Llama 3 probe has none")


def read_config(path: Path) -> ModelConfig:
    """The full model's shape from the metadata of a Llama GGUF file.

    The vocabulary is the embedding's row count (``llama.vocab_size`` is often absent).

    Raises:
        UserError: naming the file and the key that is missing, of another architecture, or not what the
            probe can run (RoPE scaling, biases, a head size other than hidden/heads).
    """
    header = read_header(path)
    _require_llama(header)
    embed = header.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise _error(header.file, "tensor 'token_embd.weight' is missing or not a matrix")
    heads = _meta(header, "llama.attention.head_count")
    try:
        cfg = ModelConfig(vocab_size=embed.shape[0], dim=_meta(header, "llama.embedding_length"),
                          n_layers=_meta(header, "llama.block_count"), n_heads=heads,
                          n_kv_heads=_meta(header, "llama.attention.head_count_kv", heads),
                          ffn_dim=_meta(header, "llama.feed_forward_length"),
                          norm_eps=_meta(header, "llama.attention.layer_norm_rms_epsilon", 1e-5, float),
                          rope_theta=_meta(header, "llama.rope.freq_base", 10000.0, float),
                          max_seq_len=_meta(header, "llama.context_length", 8192))
    except ValueError as exc:
        raise _error(header.file, f"not a valid Llama shape: {exc}") from None
    for key in ("llama.rope.dimension_count", "llama.attention.key_length", "llama.attention.value_length"):
        if key in header.metadata and _meta(header, key) != cfg.head_dim:
            raise _error(header.file, f"metadata {key!r} is {header.metadata[key]}, but embedding_length / "
                                      f"head_count = {cfg.head_dim}; the probe needs head size = hidden / heads")
    return cfg


def _hf_name(name: str) -> str | None:
    match = _BLOCK.match(name)
    if match is None:
        return HF_NAMES.get(name)
    pattern = HF_NAMES.get(f"blk.{{i}}.{match.group(2)}")
    return pattern.format(i=match.group(1)) if pattern else None


def _gguf_name(hf_name: str) -> str:
    match = _HF_BLOCK.match(hf_name)
    if match is None:
        return _GGUF_NAMES[hf_name]
    return _GGUF_NAMES[f"model.layers.{{i}}.{match.group(2)}"].format(i=match.group(1))


def tensor_index(path: Path) -> dict[str, GGUFTensorInfo]:
    """The file's Llama tensors under their Hugging Face names (others, e.g. ``rope_freqs``, are left out)."""
    return {hf: info for name, info in read_header(path).tensors.items() if (hf := _hf_name(name)) is not None}


def tied_embeddings(path: Path) -> bool:
    """Whether the output layer is the embedding: llama.cpp writes no ``output.weight`` then."""
    return "output.weight" not in read_header(path).tensors


def check_checkpoint(path: Path, layers: tuple[int, ...]) -> dict[str, GGUFTensorInfo]:
    """Check that every tensor the probe takes exists with the config's shape and a supported type.

    Returns those tensors by Hugging Face name (``lm_head.weight`` is the embedding when tied).

    Raises:
        UserError: naming the file and the GGUF tensor that is missing, misshapen or of a type not read.
    """
    cfg = read_config(path)
    index = tensor_index(path)
    if "lm_head.weight" not in index and "model.embed_tokens.weight" in index:
        index["lm_head.weight"] = index["model.embed_tokens.weight"]
    needed = {}
    for name, shape in expected_shapes(cfg, layers).items():
        info = index.get(name)
        if info is None:
            raise _error(Path(path), f"tensor {_gguf_name(name)!r} ({name}) is missing from the file")
        if info.shape != shape:
            raise _error(info.file, f"tensor {info.gguf_name!r} has shape {list(info.shape)}, the metadata implies "
                                    f"{list(shape)}")
        if info.dtype not in SUPPORTED_TYPES:
            raise _error(info.file, f"tensor {info.gguf_name!r} is stored as {info.dtype}, which is not read; "
                                    f"valid: {', '.join(SUPPORTED_TYPES)}")
        needed[name] = info
    return needed


def _hf_rows(w: Any, n_heads: int) -> Any:
    """Undo llama.cpp's Q/K row order: per head, rows (pair j, member r) -> (half r, index j)."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def read_tensors(path: Path, names: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The tensors ``names`` (Hugging Face names) of the GGUF file, dequantised to float32 numpy arrays in the
    Hugging Face layout (``q_proj``/``k_proj`` rows back in Hugging Face's RoPE order).

    Raises:
        UserError: as :func:`check_checkpoint` (a tensor missing, misshapen, of a type not read).
    """
    import numpy as np

    _gguf(Path(path))
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    cfg = read_config(path)
    index = tensor_index(path)
    if "lm_head.weight" not in index:
        index["lm_head.weight"] = index["model.embed_tokens.weight"]
    raw = np.memmap(read_header(path).file, dtype=np.uint8, mode="r")
    out = {}
    for name in names:
        info = index[name]
        rows = math.prod(info.shape[:-1])
        data = raw[info.offset:info.offset + info.nbytes].reshape(rows, info.nbytes // rows)
        w = np.array(dequantize(data, GGMLQuantizationType[info.dtype]), dtype=np.float32)
        w = w.reshape(info.shape)
        if name.endswith("self_attn.q_proj.weight"):
            w = _hf_rows(w, cfg.n_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            w = _hf_rows(w, cfg.n_kv_heads)
        out[name] = w
    return out


__all__ = ["GGUFHeader", "GGUFTensorInfo", "HF_NAMES", "SUPPORTED_TYPES", "check_checkpoint", "is_gguf",
           "read_config", "read_header", "read_tensors", "tensor_index", "tied_embeddings"]
