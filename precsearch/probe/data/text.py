"""Source ``text``: a ``.txt`` file or a directory of them, tokenized by a local tokenizer.

The tokenizer is a ``tokenizer.json`` (read with ``tokenizers``), a Hugging Face tokenizer
directory (read with ``transformers``), both from the ``text`` extra
(``pip install "precsearch[text]"``), a tiktoken-style ``tokenizer.model``, or a llama.cpp
``.gguf`` file's own tokenizer (:mod:`precsearch.probe.data.tokenizer`); without ``data.tokenizer`` the text is taken as bytes.
Nothing is ever downloaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from precsearch.errors import DataError
from precsearch.probe.data.request import TokenRequest
from precsearch.probe.data.tokenizer import encode


def read(request: TokenRequest) -> np.ndarray:
    """The token ids of the text at ``request.path`` (its bytes without a tokenizer)."""
    return _load_text(request.path, request.tokenizer, request.max_tokens)


def _text_files(path: Path) -> list[Path]:
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"no .txt files under {path}", field="data.path")
    return files


def _load_text(path: Path, tokenizer: Path | None, max_tokens: int | None) -> np.ndarray:
    files = _text_files(path)
    if tokenizer is None:
        raw = b"\n".join(f.read_bytes() for f in files)
        ids = np.frombuffer(raw, dtype=np.uint8)
    else:
        texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
        docs = _encode(texts, Path(tokenizer))
        ids = np.concatenate([np.asarray(doc, dtype=np.int64) for doc in docs])
    if max_tokens is not None:
        ids = ids[:max_tokens]
    return ids.astype(np.int64)


def _encode(texts: list[str], tokenizer: Path) -> list[list[int]]:
    """Token ids of each text with a local tokenizer; never downloads (:func:`.tokenizer.encode`)."""
    return encode(texts, tokenizer)
