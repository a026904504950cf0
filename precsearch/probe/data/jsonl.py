"""JSON Lines documents (``data.source: jsonl``): one JSON object per line, the document under ``data.field``.

``data.path`` is a ``.jsonl`` file or a directory whose ``*.jsonl`` files are read
in name order. The field holds a text (tokenized, :mod:`precsearch.probe.data.documents`)
or a list of token ids. Blank lines are skipped; a line that is not a JSON object,
or lacks the field, is an error naming the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from precsearch.errors import DataError
from precsearch.probe.data.documents import Document, documents_to_tokens
from precsearch.probe.data.request import TokenRequest


def jsonl_files(path: Path) -> list[Path]:
    """The ``.jsonl`` files of ``path`` (itself, or those under a directory, sorted)."""
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"no .jsonl files under {path}", field="data.path")
    return files


def _documents(files: list[Path], field: str) -> Iterator[tuple[str, Document]]:
    for file in files:
        with open(file, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{file} line {number}"
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise DataError(f"{where}: not JSON ({exc})", field="data.path") from None
                if not isinstance(row, dict):
                    raise DataError(f"{where}: not a JSON object", field="data.path")
                if field not in row:
                    raise DataError(f"{where}: no field {field!r}; it has {', '.join(sorted(row)) or 'no fields'}",
                                    field="data.field")
                yield where, row[field]


def read(request: TokenRequest) -> np.ndarray:
    """The tokens of the JSON Lines at ``request.path``, key ``request.field``."""
    return read_jsonl(request.path, request.field, request.tokenizer, request.max_tokens)


def read_jsonl(path: Path, field: str, tokenizer: Path | None, max_tokens: int | None) -> np.ndarray:
    """The tokens of the documents of ``path`` (int64), up to ``max_tokens``."""
    try:
        return documents_to_tokens(_documents(jsonl_files(path), field), tokenizer, max_tokens)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc})", field="data.path") from None
