"""Hugging Face ``datasets`` saved with ``save_to_disk`` (``data.source: hf_disk``), read with pyarrow alone.

A saved ``Dataset`` is a directory with ``state.json`` (its ``_data_files`` list
the shards, in order), ``dataset_info.json`` and ``data-XXXXX-of-YYYYY.arrow``
shards in Arrow's IPC stream format. A saved ``DatasetDict`` holds
``dataset_dict.json`` and one such directory per split: its ``train`` split is
read (point ``data.path`` at ``<dir>/<split>`` for another). The column
``data.field`` holds texts (``string``, tokenized) or token ids (a list of
integers, e.g. ``input_ids``). The ``datasets`` package is not needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from precsearch.errors import DataError
from precsearch.probe.data.documents import Document, documents_to_tokens
from precsearch.probe.data.request import TokenRequest
from precsearch.utils.json_io import read_json_object

STATE = "state.json"
DICT = "dataset_dict.json"
DEFAULT_SPLIT = "train"


def _error(path: Path, message: str, field: str = "data.path") -> DataError:
    return DataError(f"{path}: {message}", field=field)


def _json(path: Path) -> dict:
    return read_json_object(path, _error)


def dataset_dir(path: Path) -> Path:
    """The saved ``Dataset`` directory: ``path``, or its ``train`` split for a ``DatasetDict``."""
    path = Path(path)
    if not path.is_dir():
        raise _error(path, "not a directory; give the directory save_to_disk wrote")
    if (path / DICT).is_file():
        splits = _json(path / DICT).get("splits", [])
        if DEFAULT_SPLIT not in splits:
            raise _error(path, f"a DatasetDict without a '{DEFAULT_SPLIT}' split; give one split's directory: "
                               + ", ".join(str(path / s) for s in splits))
        path = path / DEFAULT_SPLIT
    if not (path / STATE).is_file():
        raise _error(path, f"no {STATE}: not a dataset saved with save_to_disk")
    return path


def arrow_files(directory: Path) -> list[Path]:
    """The shards ``state.json`` lists, in order, each checked to exist."""
    state = _json(directory / STATE)
    entries = state.get("_data_files")
    if not isinstance(entries, list) or not entries:
        raise _error(directory / STATE, "lists no '_data_files'")
    bad = [i for i, e in enumerate(entries) if not (isinstance(e, dict) and isinstance(e.get("filename"), str))]
    if bad:  # skipping the entry would silently drop a shard's rows
        raise _error(directory / STATE, f"_data_files[{bad[0]}] has no 'filename'")
    files = [directory / e["filename"] for e in entries]
    for file in files:
        if not file.is_file():
            raise _error(file, f"missing (listed in {STATE})")
    return files


def _batches(file: Path):
    import pyarrow as pa  # lazy: only this source needs it

    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(file)))
    except pa.ArrowInvalid:
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(file)))
            return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid as exc:
            raise _error(file, f"not an Arrow IPC file: {exc}") from None
    return reader.schema, iter(reader)


def _column_kind(file: Path, schema, field: str) -> str:
    import pyarrow as pa

    if field not in schema.names:
        raise _error(file, f"no column {field!r}; columns: {', '.join(schema.names)}", field="data.field")
    t = schema.field(field).type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type):
        return "ids"
    raise _error(file, f"column {field!r} is {t}; valid: a string (text) or a list of integers (token ids)",
                 field="data.field")


def _documents(files: list[Path], field: str) -> Iterator[tuple[str, Document]]:
    import pyarrow as pa

    for file in files:
        schema, batches = _batches(file)
        _column_kind(file, schema, field)  # a missing or wrong-typed column fails before any row
        row = 0
        try:
            for batch in batches:
                column = batch.column(field)
                values = column.to_pylist()
                for i, value in enumerate(values):
                    yield f"{file} row {row + i}", value if value is not None else ""
                row += len(values)
        except (pa.ArrowInvalid, OSError) as exc:
            raise _error(file, f"corrupt or truncated Arrow data after row {row}: {exc}") from None


def read(request: TokenRequest) -> np.ndarray:
    """The tokens of the saved dataset at ``request.path``, column ``request.field``."""
    return read_hf_disk(request.path, request.field, request.tokenizer, request.max_tokens)


def read_hf_disk(path: Path, field: str, tokenizer: Path | None, max_tokens: int | None) -> np.ndarray:
    """The tokens of the saved dataset's ``field`` column (int64), up to ``max_tokens``."""
    files = arrow_files(dataset_dir(path))
    return documents_to_tokens(_documents(files, field), tokenizer, max_tokens)
