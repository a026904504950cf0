"""Source ``tokens``: a pre-tokenized ``.npy`` file, or a raw ``.bin`` of ``data.dtype``.

Memory-mapped: with ``max_tokens`` only the pages of the kept tokens are read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from precsearch.errors import DataError
from precsearch.probe.data.request import TokenRequest

#: ``dtype`` values accepted for ``.bin`` token files.
TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32, "int32": np.int32, "int64": np.int64}


def read(request: TokenRequest) -> np.ndarray:
    """The token ids of the file at ``request.path``."""
    return _load_token_file(request.path, request.dtype, request.max_tokens)


def _load_token_file(path: Path, dtype: str, max_tokens: int | None) -> np.ndarray:
    if dtype not in TOKEN_DTYPES:
        raise DataError(f"unknown dtype {dtype!r}; valid: {', '.join(TOKEN_DTYPES)}", field="data.dtype")
    if not path.is_file():
        raise DataError(f"not a file: {path}", field="data.path")
    array = _open_npy(path) if path.suffix == ".npy" else _open_bin(path, TOKEN_DTYPES[dtype])
    if max_tokens is not None:
        array = array[:max_tokens]  # slice the memmap first: only these pages are read
    return np.array(array, dtype=np.int64)


def _open_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"cannot read {path} as .npy: {exc}", field="data.path") from None
    if not isinstance(array, np.ndarray):  # an .npz archive under an .npy name
        raise DataError(f"{path} is not a single .npy array (an .npz archive?)", field="data.path")
    if not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{path} holds {array.dtype}, not integer token ids", field="data.path")
    return array.reshape(-1)


def _open_bin(path: Path, dtype: type[np.integer]) -> np.ndarray:
    size, itemsize = path.stat().st_size, np.dtype(dtype).itemsize
    if size % itemsize:
        raise DataError(
            f"{path} is {size} bytes, not a whole number of {np.dtype(dtype).name} tokens", field="data.dtype"
        )
    if size == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
