"""Source ``stdlib``: the Python standard library's own ``.py`` files as bytes (tokens 0..255).

Real text that exists offline on every machine.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from precsearch.probe.data.request import TokenRequest

if TYPE_CHECKING:
    import torch

#: Cap on ``stdlib`` bytes when ``max_tokens`` is not given: enough text, loads in well under 1 s.
DEFAULT_STDLIB_BYTES = 8 * 2**20

# Directories under the stdlib path that hold third-party code, not the stdlib.
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "__pycache__"})


def read(request: TokenRequest) -> np.ndarray:
    """The first ``max_tokens`` bytes of the stdlib (:data:`DEFAULT_STDLIB_BYTES` without a cap), as int64 tokens."""
    return _byte_tokens(DEFAULT_STDLIB_BYTES if request.max_tokens is None else request.max_tokens)


def _sorted_py_files(root: Path) -> Iterator[Path]:
    """``.py`` files under ``root``, depth first, each directory's entries in name order."""
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in _STDLIB_SKIP:
                yield from _sorted_py_files(Path(entry.path))
        elif entry.name.endswith(".py") and entry.is_file():
            yield Path(entry.path)


@functools.lru_cache(maxsize=4)
def stdlib_bytes(max_bytes: int = DEFAULT_STDLIB_BYTES) -> bytes:
    """The first ``max_bytes`` of the stdlib's ``.py`` files, newline-separated (cached).

    Files are walked lazily in sorted order, so a small cap reads few files.
    Third-party ``site-packages`` under the stdlib directory are skipped.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[bytes] = []
    total = 0
    for file in _sorted_py_files(root):
        parts.append(file.read_bytes())
        total += len(parts[-1]) + 1
        if total >= max_bytes:
            break
    return b"\n".join(parts)[:max_bytes]


def _byte_tokens(max_bytes: int) -> np.ndarray:
    return np.frombuffer(stdlib_bytes(max_bytes), dtype=np.uint8).astype(np.int64)  # a writable copy


def stdlib_tokens(max_bytes: int = DEFAULT_STDLIB_BYTES) -> torch.Tensor:
    """:func:`stdlib_bytes` as int64 byte tokens (0..255)."""
    import torch

    return torch.from_numpy(_byte_tokens(max_bytes))
