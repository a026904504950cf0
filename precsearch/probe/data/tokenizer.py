"""Local tokenizers for the text sources; nothing is ever downloaded.

``data.tokenizer`` may be:

* a ``tokenizer.json`` (Hugging Face ``tokenizers``; Llama 3 ships one), or
  a Hugging Face tokenizer directory (``AutoTokenizer``, ``local_files_only``);
* a llama.cpp GGUF file (``.gguf``, e.g. the one ``model.init_from`` names): the byte-level BPE
  tokenizer kept in its metadata (:mod:`precsearch.probe.data.gguf_tokenizer`;
  ``pip install "precsearch[text,gguf]"``);
* a tiktoken-style ``tokenizer.model`` (Meta's Llama 3 release): one
  ``<base64 token> <rank>`` line per token. It is read with ``tiktoken``
  (optional: ``pip install "precsearch[tiktoken]"``) and Llama 3's pre-tokenizer pattern;
  Llama 3's 256 special tokens are numbered after the ranks, as Meta's
  ``tokenizer.py`` does, but never produced from plain text.

Texts are encoded without BOS/EOS: the probe's stream is the texts concatenated.
"""

from __future__ import annotations

import base64
import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from precsearch.arch.gguf_checkpoint import is_gguf
from precsearch.errors import DataError
from precsearch.probe.data.gguf_tokenizer import gguf_tokenizer
from precsearch.probe.data.split_patterns import LLAMA3_PATTERN

FIELD = "data.tokenizer"
#: Special tokens Llama 3 numbers after the BPE ranks.
LLAMA3_SPECIAL = 256


def _import(module: str, name: str) -> Any:
    """``module.name``, or a DataError naming the extra that installs it."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        raise DataError(f"data.tokenizer needs the '{module}' package: pip install \"precsearch[text]\"",
                        field=FIELD) from None


def is_bpe_ranks(path: Path) -> bool:
    """Whether ``path`` is a tiktoken ranks file (first line ``<base64> <int>``), not JSON."""
    with open(path, "rb") as f:
        first = f.readline().split()
    if len(first) != 2 or not first[1].isdigit():
        return False
    try:
        base64.b64decode(first[0], validate=True)
    except ValueError:
        return False
    return True


def load_ranks(path: Path) -> dict[bytes, int]:
    """The ``token bytes -> rank`` map of a tiktoken ranks file.

    Raises:
        DataError: naming the line that is not ``<base64> <rank>``.
    """
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, IndexError):
            raise DataError(f"{path} line {number}: not '<base64 token> <rank>'", field=FIELD) from None
        ranks[token] = rank
    return ranks


def _tiktoken_encoder(path: Path) -> Callable[[list[str]], list[list[int]]]:
    try:
        import tiktoken
    except ImportError:
        raise DataError(f"{path} is a tiktoken-style tokenizer.model; reading it needs the tiktoken package "
                        f"(pip install tiktoken), or give the checkpoint's tokenizer.json instead",
                        field=FIELD) from None
    ranks = load_ranks(path)
    specials = {f"<|reserved_special_token_{i}|>": len(ranks) + i for i in range(LLAMA3_SPECIAL)}
    encoding = tiktoken.Encoding(name=path.stem, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                                 special_tokens=specials)
    return encoding.encode_ordinary_batch


@functools.lru_cache(maxsize=4)
def _encoder(tokenizer: Path, mtime_ns: int) -> Callable[[list[str]], list[list[int]]]:
    """The batch encoder of ``tokenizer``, loaded once per file version (``mtime_ns``), not once per
    chunk of texts: the jsonl and hf_disk sources encode 256 texts per call, and parsing Llama 3's
    tokenizer.json or its 128k-line ranks file per call would dominate reading a large dataset."""
    if tokenizer.is_file() and is_gguf(tokenizer):
        tok = gguf_tokenizer(tokenizer)
        return lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    if tokenizer.is_file() and is_bpe_ranks(tokenizer):
        return _tiktoken_encoder(tokenizer)
    if tokenizer.is_file():
        Tokenizer = _import("tokenizers", "Tokenizer")  # lazy: only the text sources need it
        tok = Tokenizer.from_file(str(tokenizer))
        return lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    AutoTokenizer = _import("transformers", "AutoTokenizer")  # lazy: slow to import
    hf_tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    return lambda texts: hf_tok(texts, add_special_tokens=False)["input_ids"]


def encode(texts: list[str], tokenizer: Path) -> list[list[int]]:
    """Token ids of each text with a local tokenizer (see the module docstring).

    Raises:
        DataError: a missing tokenizer, or one that does not load, naming ``data.tokenizer``.
    """
    tokenizer = Path(tokenizer)
    if not tokenizer.exists():
        raise DataError(f"no such tokenizer file or directory: {tokenizer}", field=FIELD)
    try:
        return _encoder(tokenizer.resolve(), tokenizer.stat().st_mtime_ns)(texts)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure is bad user input here
        raise DataError(f"cannot use tokenizer {tokenizer}: {exc}", field=FIELD) from exc
