"""A stream of documents (texts or token-id lists) turned into the probe's token stream.

Shared by the ``jsonl`` and ``hf_disk`` sources: a text is tokenized with
``data.tokenizer`` (:mod:`precsearch.probe.data.tokenizer`) or taken as UTF-8 bytes
without one; a list of integers is already token ids. Documents are read only
until ``max_tokens`` tokens are in hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from precsearch.errors import DataError
from precsearch.probe.data.tokenizer import encode

#: Texts tokenized per call.
CHUNK = 256
Document = str | list[int]


def _ids(doc: Document, where: str) -> np.ndarray | None:
    """Token ids of a pre-tokenized document, None for a text."""
    if isinstance(doc, str):
        return None
    if isinstance(doc, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in doc):
        return np.asarray(doc, dtype=np.int64)
    raise DataError(f"{where}: the field holds {type(doc).__name__}, not a text or a list of token ids",
                    field="data.field")


def _encoded(texts: list[str], tokenizer: Path | None) -> Iterator[np.ndarray]:
    if tokenizer is None:
        yield from (np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts)
    else:
        yield from (np.asarray(ids, dtype=np.int64) for ids in encode(texts, tokenizer))


def documents_to_tokens(docs: Iterable[tuple[str, Document]], tokenizer: Path | None,
                        max_tokens: int | None) -> np.ndarray:
    """The documents' tokens concatenated (int64), stopping once ``max_tokens`` are read.

    Args:
        docs: ``(where, document)`` pairs; ``where`` (file and line or row) names a bad document.
        tokenizer: for texts; None reads texts as UTF-8 bytes (tokens 0..255).
        max_tokens: stop reading documents after this many tokens.
    """
    parts: list[np.ndarray] = []
    total, texts = 0, []

    def flush() -> None:
        nonlocal total
        for ids in _encoded(texts, tokenizer):
            parts.append(ids)
            total += ids.size
        texts.clear()

    for where, doc in docs:
        ids = _ids(doc, where)
        if ids is None:
            texts.append(doc)
            if len(texts) >= CHUNK:
                flush()
        else:
            flush()  # keep document order
            parts.append(ids)
            total += ids.size
        if max_tokens is not None and total >= max_tokens:
            break
    flush()
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return out[:max_tokens]
