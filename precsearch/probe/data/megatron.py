"""Megatron-Core indexed datasets (``prefix.bin`` + ``prefix.idx``), read with numpy alone.

The ``.idx`` layout, as ``megatron/core/datasets/indexed_dataset.py`` writes it
(``_IndexWriter``), all little-endian::

    9 bytes   magic  b"MMIDIDX\\x00\\x00"
    8 bytes   version (uint64), 1
    1 byte    dtype code (uint8): 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    8 bytes   sequence count N (uint64)
    8 bytes   document count D (uint64)
    N x int32 sequence lengths (tokens)
    N x int64 sequence pointers (byte offsets into .bin)
    D x int64 document indices (sequence index where each document ends, starting with 0)
    [N x int8 sequence modes, multimodal datasets only]

The ``.bin`` holds the token ids of every sequence, in the index's dtype. The
probe's stream is the sequences in index order, concatenated. Every check
(magic, version, dtype, sizes, pointers inside the ``.bin``) runs before a
token is read, and each failure names the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from precsearch.errors import DataError
from precsearch.probe.data.request import TokenRequest

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
#: Megatron's ``DType`` codes.
DTYPE_CODES: dict[int, type[np.number]] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                                           6: np.float64, 7: np.float32, 8: np.uint16}
_HEADER = 9 + 8 + 1 + 8 + 8


@dataclass(frozen=True)
class MegatronIndex:
    """The parsed ``.idx``: token dtype, per-sequence lengths and byte offsets, document boundaries."""

    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray
    documents: np.ndarray


def _error(path: Path, message: str) -> DataError:
    return DataError(f"{path}: {message}", field="data.path")


def megatron_paths(path: Path) -> tuple[Path, Path]:
    """``(prefix.idx, prefix.bin)`` from the prefix, or from either file's path.

    Raises:
        DataError: either file is missing.
    """
    path = Path(path)
    prefix = path.with_suffix("") if path.suffix in (".bin", ".idx") else path
    idx, bin_ = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    for file in (idx, bin_):
        if not file.is_file():
            raise _error(file, "missing: a Megatron indexed dataset is a .bin and an .idx with one prefix")
    return idx, bin_


def read_index(idx: Path) -> MegatronIndex:
    """Parse and check an ``.idx`` file (memory-mapped: a large index is not read whole)."""
    size = idx.stat().st_size
    if size < _HEADER:
        raise _error(idx, f"{size} bytes is shorter than the {_HEADER}-byte header")
    raw = np.memmap(idx, dtype=np.uint8, mode="r")
    if bytes(raw[:9]) != MAGIC:
        raise _error(idx, f"bad magic {bytes(raw[:9])!r}, expected {MAGIC!r}: not a Megatron .idx (MMIDIDX)")
    version, = np.frombuffer(raw[9:17], dtype="<u8")
    if version != VERSION:
        raise _error(idx, f"index version {version}; only version {VERSION} is known")
    code = int(raw[17])
    if code not in DTYPE_CODES or not np.issubdtype(DTYPE_CODES[code], np.integer):
        known = ", ".join(f"{k} {v.__name__}" for k, v in DTYPE_CODES.items())
        raise _error(idx, f"dtype code {code} is not an integer token type (codes: {known})")
    n, d = (int(x) for x in np.frombuffer(raw[18:34], dtype="<u8"))
    need = _HEADER + 4 * n + 8 * n + 8 * d
    if size < need:
        raise _error(idx, f"truncated: {n} sequences and {d} documents need {need} bytes, the file has {size}")
    lengths = np.frombuffer(raw, dtype="<i4", count=n, offset=_HEADER)
    pointers = np.frombuffer(raw, dtype="<i8", count=n, offset=_HEADER + 4 * n)
    documents = np.frombuffer(raw, dtype="<i8", count=d, offset=_HEADER + 12 * n)
    if n and (lengths.min() < 0 or pointers.min() < 0):
        raise _error(idx, "negative sequence length or pointer: a corrupt index")
    if d and (documents.min() < 0 or documents.max() > n or np.any(np.diff(documents) < 0)):
        raise _error(idx, f"document indices are not increasing within 0..{n}: a corrupt index")
    return MegatronIndex(np.dtype(DTYPE_CODES[code]).newbyteorder("<"), lengths, pointers, documents)


def read(request: TokenRequest) -> np.ndarray:
    """The tokens of the dataset whose prefix (or ``.bin``/``.idx``) is ``request.path``."""
    return read_megatron(request.path, request.max_tokens)


def read_megatron(path: Path, max_tokens: int | None = None) -> np.ndarray:
    """The dataset's tokens in index order (the first ``max_tokens``), as int64.

    Raises:
        DataError: a missing file, a bad header, or a ``.bin`` shorter than the index says (truncated).
    """
    idx, bin_ = megatron_paths(path)
    index = read_index(idx)
    itemsize, bin_size = index.dtype.itemsize, bin_.stat().st_size
    if not len(index.lengths):
        return np.zeros(0, dtype=np.int64)
    if np.any(index.pointers % itemsize):
        raise _error(idx, f"a sequence pointer is not a multiple of the {itemsize}-byte {index.dtype.name} tokens")
    ends = index.pointers + index.lengths.astype(np.int64) * itemsize
    if int(ends.max()) > bin_size:
        worst = int(np.argmax(ends))
        raise _error(bin_, f"truncated: sequence {worst} ends at byte {int(ends[worst])}, the file has {bin_size} "
                           f"bytes (or the .idx belongs to another .bin)")
    tokens = np.memmap(bin_, dtype=index.dtype, mode="r") if bin_size else np.zeros(0, index.dtype)
    starts = index.pointers // itemsize
    contiguous = index.pointers[0] == 0 and np.array_equal(index.pointers[1:], ends[:-1])
    if contiguous:  # what Megatron's builder writes: one slice, only the pages needed are read
        stream = tokens[: int(ends[-1]) // itemsize]
        return np.array(stream[:max_tokens], dtype=np.int64)
    parts, total = [], 0
    for start, length in zip(starts, index.lengths):
        parts.append(tokens[int(start): int(start) + int(length)])
        total += int(length)
        if max_tokens is not None and total >= max_tokens:
            break
    return np.concatenate(parts).astype(np.int64)[:max_tokens]
