"""Which readers give the probe its token stream (``data.source``), and loading it for a space.

Sources (``data.source``):

* ``stdlib``: the Python standard library's own ``.py`` files as bytes
  (tokens 0..255). Real text that exists offline on every machine.
* ``synthetic``: a seeded stream with learnable structure (see
  :func:`synthetic_tokens`), for tests and smoke runs.
* ``tokens``: a pre-tokenized ``.npy`` file, or a raw ``.bin`` of ``dtype``.
* ``text``: a ``.txt`` file or a directory of them, tokenized by a local
  tokenizer (a ``tokenizer.json`` or a Hugging Face tokenizer directory), or
  taken as bytes when no tokenizer is given. Nothing is ever downloaded.
* ``megatron``: a Megatron-Core indexed dataset, ``prefix.bin`` + ``prefix.idx`` (numpy memmap).
* ``hf_disk``: a Hugging Face dataset saved with ``save_to_disk`` (Arrow, read with pyarrow), column ``field``.
* ``jsonl``: JSON Lines, the document under ``field``.

One module per source kind in this package, each with a ``read(TokenRequest)``; :data:`READERS`
maps ``data.source`` names to them. A new kind (Megatron indexed datasets, Hugging Face Arrow,
JSONL) is a new module here and one entry in :data:`READERS`, named as in
:class:`precsearch.config.data_source.DataSource` (the names the space file accepts; a test keeps the two equal). :class:`~precsearch.probe.data.batches.TokenBatches`
splits a stream into a training part and a fixed held-out tail, and cuts deterministic batches.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from precsearch.config.data_source import FILE_SOURCES as SPACE_FILE_SOURCES
from precsearch.config.data_source import PREFIX_SOURCES as SPACE_PREFIX_SOURCES, DataSource
from precsearch.errors import DataError
from precsearch.probe.data import hf_disk, jsonl, megatron, stdlib, synthetic, text, token_file
from precsearch.probe.data.request import TokenRequest
from precsearch.probe.data.split import held_out_start

if TYPE_CHECKING:
    import torch

    from precsearch.config.space import Space
    from precsearch.probe.data.batches import TokenBatches

READERS: dict[str, Callable[[TokenRequest], np.ndarray]] = {
    DataSource.STDLIB.value: stdlib.read,
    DataSource.SYNTHETIC.value: synthetic.read,
    DataSource.TOKENS.value: token_file.read,
    DataSource.TEXT.value: text.read,
    DataSource.MEGATRON.value: megatron.read,
    DataSource.HF_DISK.value: hf_disk.read,
    DataSource.JSONL.value: jsonl.read,
}
"""``data.source`` name (:class:`~precsearch.config.data_source.DataSource`) -> reader of its 1-D int64 token
stream (a numpy array: reading and checking data needs no torch); what each source needs is in :data:`~precsearch.config.data_source.SOURCE_KINDS`."""

SOURCES = tuple(READERS)
#: Sources read from ``data.path`` (checked to exist first; an unreadable file is the user's, not a bug),
#: and those whose path is a prefix their reader checks: the space file's table, so validation and reading agree.
FILE_SOURCES = tuple(source.value for source in SPACE_FILE_SOURCES)
PREFIX_SOURCES = tuple(source.value for source in SPACE_PREFIX_SOURCES)
#: A stream must hold at least one (input, target) pair.
MIN_TOKENS = 2


def load_tokens(
    source: str,
    *,
    path: Path | None = None,
    tokenizer: Path | None = None,
    dtype: str = "uint16",
    max_tokens: int | None = None,
    seed: int = 0,
    vocab_size: int | None = None,
    field: str = "text",
) -> torch.Tensor:
    """Load a token stream as a 1-D int64 tensor.

    Args:
        source: one of :data:`SOURCES`.
        path: the file or directory for ``tokens`` and ``text``.
        tokenizer: ``tokenizer.json`` or tokenizer directory for ``text`` (bytes if None).
        dtype: element type of a ``.bin`` token file, one of
            :data:`~precsearch.probe.data.token_file.TOKEN_DTYPES`.
        max_tokens: keep only the first ``max_tokens`` tokens.
        seed: seed of the ``synthetic`` stream.
        vocab_size: the model's vocabulary; every token must be below it. Also the
            vocabulary of the ``synthetic`` stream.
        field: the column (``hf_disk``) or key (``jsonl``) holding each document.

    Raises:
        DataError: unknown source, missing or unreadable file, bad dtype, token ids
            outside ``[0, vocab_size)``, or fewer than :data:`MIN_TOKENS` tokens.
    """
    import torch

    request = TokenRequest(source, path, tokenizer, dtype, max_tokens, seed, vocab_size, field)
    return torch.from_numpy(_stream(request))


def _stream(request: TokenRequest) -> np.ndarray:
    """:func:`load_tokens`'s stream as a writable int64 numpy array."""
    source, path, max_tokens = request.source, request.path, request.max_tokens
    if max_tokens is not None and max_tokens < MIN_TOKENS:
        raise DataError(f"must be at least {MIN_TOKENS}, got {max_tokens}", field="data.max_tokens")
    if source not in READERS:
        raise DataError(f"unknown source {source!r}; valid: {', '.join(SOURCES)}", field="data.source")
    if source in FILE_SOURCES:
        try:
            tokens = READERS[source](dataclasses.replace(request, path=_existing(path, source)))
        except OSError as exc:  # unreadable (permissions, a special file): the user's file, not a bug
            raise DataError(f"cannot read {exc.filename or path}: {exc.strerror or exc}", field="data.path") from None
    else:
        tokens = READERS[source](request)
    where = f"{path}" if source in FILE_SOURCES else f"the {source} stream"
    _check_tokens(tokens, request.vocab_size, where, field="data.path" if source in FILE_SOURCES else "data.source")
    return np.require(tokens, np.int64, ["C_CONTIGUOUS", "WRITEABLE"])


def _existing(path: Path | None, source: str) -> Path:
    if path is None:
        raise DataError(f"source {source!r} needs a path", field="data.path")
    path = Path(path)
    if source not in PREFIX_SOURCES and not path.exists():
        raise DataError(f"no such file or directory: {path}", field="data.path")
    return path


def _check_tokens(tokens: np.ndarray, vocab_size: int | None, where: str, *, field: str) -> None:
    if tokens.size < MIN_TOKENS:
        raise DataError(f"{where} holds only {tokens.size} tokens; need at least {MIN_TOKENS}", field=field)
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0:
        raise DataError(f"{where} has a negative token id {low}", field=field)
    if vocab_size is not None and high >= vocab_size:
        raise DataError(f"{where} has token id {high}, out of range for the model's vocab_size {vocab_size} "
                        f"(model.vocab_size, or the preset's)", field=field)


def load_batches(space: "Space") -> TokenBatches:
    """The space's token stream as deterministic training batches plus the fixed held-out set.

    Raises:
        DataError: naming the data file (or source) and the field to change.
    """
    import torch

    from precsearch.probe.data.batches import TokenBatches

    tokens = _space_stream(space)
    d, p = space.data, space.probe
    with _located(space, tokens.size):
        return TokenBatches(torch.from_numpy(tokens), seq_len=p.seq_len, micro_batch=p.micro_batch, seed=p.seed,
                            eval_batches=d.eval_batches, grad_accum=p.grad_accum)


def _space_stream(space: "Space") -> np.ndarray:
    d = space.data
    return _stream(TokenRequest(d.source.value, d.path, d.tokenizer, d.dtype, d.max_tokens, space.probe.seed,
                                space.model.probe().vocab_size, d.field))


@contextlib.contextmanager
def _located(space: "Space", n_tokens: int) -> Iterator[None]:
    """A stream too short for the space's batches: the DataError names the file and the field to change."""
    d = space.data
    try:
        yield
    except DataError as exc:
        where = d.path if d.path is not None else f"the {d.source.value} stream"
        limited = d.max_tokens is not None and n_tokens == d.max_tokens
        raise DataError(f"{where}: {exc.detail}; give more tokens or lower probe.seq_len, probe.micro_batch or "
                        f"data.eval_batches", field="data.max_tokens" if limited else
                        "data.path" if d.path is not None else "data.source") from None


def check_data(space: "Space") -> None:
    """Read the space's data once as a probe would, so that a bad file stops the run before any trial.

    Costs one load of the stream (what each probe process does at its start); needs no torch: the
    stream is read as numpy and checked against the split :class:`~.batches.TokenBatches` would make.

    Raises:
        DataError: naming the data file (or source) and the field to change.
    """
    tokens = _space_stream(space)
    with _located(space, tokens.size):
        held_out_start(tokens.size, seq_len=space.probe.seq_len, micro_batch=space.probe.micro_batch,
                       eval_batches=space.data.eval_batches)
