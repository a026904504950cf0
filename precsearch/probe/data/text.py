"""Source ``text``: a ``.txt`` file or a directory of them, tokenized by a local tokenizer.

The tokenizer is a ``tokenizer.json`` (read with ``tokenizers``) or a Hugging Face tokenizer
directory (read with ``transformers``), both from the ``text`` extra
(``pip install "precsearch[text]"``); without ``data.tokenizer`` the text is taken as bytes.
Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from precsearch.errors import DataError
from precsearch.probe.data.request import TokenRequest


def read(request: TokenRequest) -> torch.Tensor:
    """The token ids of the text at ``request.path`` (its bytes without a tokenizer)."""
    return _load_text(request.path, request.tokenizer, request.max_tokens)


def _import(module: str, name: str) -> Any:
    """``module.name``, or a DataError naming the extra that installs it."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        raise DataError(f"data.source: text with a tokenizer needs the '{module}' package: "
                        'pip install "precsearch[text]"', field="data.tokenizer") from None


def _text_files(path: Path) -> list[Path]:
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"no .txt files under {path}", field="data.path")
    return files


def _load_text(path: Path, tokenizer: Path | None, max_tokens: int | None) -> torch.Tensor:
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
    return torch.from_numpy(ids.astype(np.int64))


def _encode(texts: list[str], tokenizer: Path) -> list[list[int]]:
    """Token ids of each text with a local tokenizer; never downloads."""
    if not tokenizer.exists():
        raise DataError(f"no such tokenizer file or directory: {tokenizer}", field="data.tokenizer")
    try:
        if tokenizer.is_file():
            Tokenizer = _import("tokenizers", "Tokenizer")  # lazy: only the text source needs it
            encodings = Tokenizer.from_file(str(tokenizer)).encode_batch(texts, add_special_tokens=False)
            return [e.ids for e in encodings]
        AutoTokenizer = _import("transformers", "AutoTokenizer")  # lazy: slow to import
        hf_tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        return hf_tok(texts, add_special_tokens=False)["input_ids"]
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure is bad user input here
        raise DataError(f"cannot use tokenizer {tokenizer}: {exc}", field="data.tokenizer") from exc
