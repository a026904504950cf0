"""The data sources a space file may name (``data.source``), each with what it needs, in one table.

:data:`SOURCE_KINDS` is the one list: the space file's validation reads it (which sources need
``data.path``, which take a tokenizer) and so do the probe's readers
(:data:`precsearch.probe.data.sources.READERS`, one reader per source, kept complete by a test).
A new source is a row here and a reader module in :mod:`precsearch.probe.data`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class DataSource(str, Enum):
    """The names ``data.source`` accepts."""

    STDLIB = "stdlib"  # the Python standard library's source, as bytes
    SYNTHETIC = "synthetic"  # a seeded stream with learnable structure
    TOKENS = "tokens"  # pre-tokenized .npy / .bin
    TEXT = "text"  # plain text + a local tokenizer (or bytes)
    MEGATRON = "megatron"  # a Megatron-Core indexed dataset: prefix.bin + prefix.idx
    HF_DISK = "hf_disk"  # a Hugging Face dataset saved with save_to_disk (Arrow)
    JSONL = "jsonl"  # JSON Lines, one document per line under `field`


@dataclass(frozen=True)
class SourceKind:
    """What one source needs.

    Attributes:
        reads_path: It reads ``data.path`` (checked to exist first).
        prefix: Its path is a prefix naming several files, which its reader checks.
        tokenized: Its documents may be texts, so ``data.tokenizer`` applies.
    """

    reads_path: bool = False
    prefix: bool = False
    tokenized: bool = False


SOURCE_KINDS: dict[DataSource, SourceKind] = {
    DataSource.STDLIB: SourceKind(),
    DataSource.SYNTHETIC: SourceKind(),
    DataSource.TOKENS: SourceKind(reads_path=True),
    DataSource.TEXT: SourceKind(reads_path=True, tokenized=True),
    DataSource.MEGATRON: SourceKind(reads_path=True, prefix=True),
    DataSource.HF_DISK: SourceKind(reads_path=True, tokenized=True),
    DataSource.JSONL: SourceKind(reads_path=True, tokenized=True),
}

#: Sources read from ``data.path``.
FILE_SOURCES = tuple(s for s, kind in SOURCE_KINDS.items() if kind.reads_path)
#: Sources whose documents may be texts, so a tokenizer applies.
TOKENIZED_SOURCES = tuple(s for s, kind in SOURCE_KINDS.items() if kind.tokenized)
#: File sources whose path is a prefix naming several files: their reader checks those.
PREFIX_SOURCES = tuple(s for s, kind in SOURCE_KINDS.items() if kind.prefix)
