"""What a source reader is asked for: one place for the ``data`` section's settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TokenRequest:
    """The settings a reader (:data:`precsearch.probe.data.sources.READERS`) gets.

    Attributes:
        source: The ``data.source`` name.
        path: The file or directory (file sources only; checked to exist before the reader runs).
        tokenizer: ``tokenizer.json`` or a tokenizer directory (``text``; bytes if None).
        dtype: Element type of a ``.bin`` token file.
        max_tokens: Keep only the first ``max_tokens`` tokens (None: the source's default or all).
        seed: Seed of a generated stream.
        vocab_size: The model's vocabulary (also that of a generated stream).
    """

    source: str
    path: Path | None = None
    tokenizer: Path | None = None
    dtype: str = "uint16"
    max_tokens: int | None = None
    seed: int = 0
    vocab_size: int | None = None
