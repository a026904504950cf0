"""Token streams for the probe, and the batches cut from them.

Sources (``data.source``):

* ``stdlib``: the Python standard library's own ``.py`` files as bytes
  (tokens 0..255). Real text that exists offline on every machine.
* ``synthetic``: a seeded stream with learnable structure (see
  :func:`synthetic_tokens`), for tests and smoke runs.
* ``tokens``: a pre-tokenized ``.npy`` file, or a raw ``.bin`` of ``dtype``.
* ``text``: a ``.txt`` file or a directory of them, tokenized by a local
  tokenizer (a ``tokenizer.json`` or a Hugging Face tokenizer directory), or
  taken as bytes when no tokenizer is given. Nothing is ever downloaded.
* ``megatron``: a Megatron-Core indexed dataset, ``prefix.bin`` + ``prefix.idx``
  (:mod:`precsearch.probe.data_megatron`).
* ``hf_disk``: a Hugging Face dataset saved with ``save_to_disk``, column
  ``field`` (:mod:`precsearch.probe.data_hf_disk`).
* ``jsonl``: JSON Lines, the document under ``field`` (:mod:`precsearch.probe.data_jsonl`).

:class:`TokenBatches` splits a stream into a training part and a fixed held-out
tail, and cuts deterministic batches from them.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from typing import TYPE_CHECKING

from precsearch.errors import DataError
from precsearch.probe.data_hf_disk import read_hf_disk
from precsearch.probe.data_jsonl import read_jsonl
from precsearch.probe.data_megatron import read_megatron
from precsearch.probe.tokenize import encode

if TYPE_CHECKING:
    from precsearch.config.space import Space

SOURCES = ("stdlib", "synthetic", "tokens", "text", "megatron", "hf_disk", "jsonl")
#: Sources that read ``data.path``.
FILE_SOURCES = ("tokens", "text", "megatron", "hf_disk", "jsonl")
#: Cap on ``stdlib`` bytes when ``max_tokens`` is not given: enough text, loads in well under 1 s.
DEFAULT_STDLIB_BYTES = 8 * 2**20
#: Length of the ``synthetic`` stream when ``max_tokens`` is not given.
DEFAULT_SYNTHETIC_TOKENS = 2**20
#: Vocabulary of the ``synthetic`` stream when ``vocab_size`` is not given (byte-sized).
DEFAULT_SYNTHETIC_VOCAB = 256
#: ``dtype`` values accepted for ``.bin`` token files.
TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32, "int32": np.int32, "int64": np.int64}
#: A stream must hold at least one (input, target) pair.
MIN_TOKENS = 2

# Directories under the stdlib path that hold third-party code, not the stdlib.
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "__pycache__"})


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
        dtype: element type of a ``.bin`` token file, one of :data:`TOKEN_DTYPES`.
        max_tokens: keep only the first ``max_tokens`` tokens.
        seed: seed of the ``synthetic`` stream.
        vocab_size: the model's vocabulary; every token must be below it. Also the
            vocabulary of the ``synthetic`` stream.
        field: the column (``hf_disk``) or key (``jsonl``) holding each document.

    Raises:
        DataError: unknown source, missing or unreadable file, bad dtype, token ids
            outside ``[0, vocab_size)``, or fewer than :data:`MIN_TOKENS` tokens.
    """
    if max_tokens is not None and max_tokens < MIN_TOKENS:
        raise DataError(f"must be at least {MIN_TOKENS}, got {max_tokens}", field="data.max_tokens")
    if source == "stdlib":
        tokens = stdlib_tokens(DEFAULT_STDLIB_BYTES if max_tokens is None else max_tokens)
    elif source == "synthetic":
        n_tokens = DEFAULT_SYNTHETIC_TOKENS if max_tokens is None else max_tokens
        tokens = synthetic_tokens(n_tokens, vocab_size or DEFAULT_SYNTHETIC_VOCAB, seed)
    elif source in FILE_SOURCES:
        try:
            tokens = _load_file_source(source, path, tokenizer, dtype, max_tokens, field)
        except OSError as exc:  # unreadable (permissions, a special file): the user's file, not a bug
            raise DataError(f"cannot read {exc.filename or path}: {exc.strerror or exc}", field="data.path") from None
    else:
        raise DataError(f"unknown source {source!r}; valid: {', '.join(SOURCES)}", field="data.source")
    where = f"{path}" if source in FILE_SOURCES else f"the {source} stream"
    _check_tokens(tokens, vocab_size, where, field="data.path" if source in FILE_SOURCES else "data.source")
    return tokens


def _load_file_source(source: str, path: Path | None, tokenizer: Path | None, dtype: str, max_tokens: int | None,
                      field: str) -> torch.Tensor:
    if source == "megatron":  # a prefix names two files: the reader checks both
        if path is None:
            raise DataError("source 'megatron' needs a path (the .bin/.idx prefix)", field="data.path")
        return torch.from_numpy(read_megatron(Path(path), max_tokens))
    path = _existing(path, source)
    if source == "tokens":
        return _load_token_file(path, dtype, max_tokens)
    if source == "text":
        return _load_text(path, tokenizer, max_tokens)
    read = read_hf_disk if source == "hf_disk" else read_jsonl
    return torch.from_numpy(read(path, field, tokenizer, max_tokens))


def _existing(path: Path | None, source: str) -> Path:
    if path is None:
        raise DataError(f"source {source!r} needs a path", field="data.path")
    path = Path(path)
    if not path.exists():
        raise DataError(f"no such file or directory: {path}", field="data.path")
    return path


def _check_tokens(tokens: torch.Tensor, vocab_size: int | None, where: str, *, field: str) -> None:
    if tokens.numel() < MIN_TOKENS:
        raise DataError(f"{where} holds only {tokens.numel()} tokens; need at least {MIN_TOKENS}", field=field)
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0:
        raise DataError(f"{where} has a negative token id {low}", field=field)
    if vocab_size is not None and high >= vocab_size:
        raise DataError(f"{where} has token id {high}, out of range for the model's vocab_size {vocab_size} "
                        f"(model.vocab_size, or the preset's)", field=field)


# --- stdlib ---------------------------------------------------------------------------


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


def stdlib_tokens(max_bytes: int = DEFAULT_STDLIB_BYTES) -> torch.Tensor:
    """:func:`stdlib_bytes` as int64 byte tokens (0..255)."""
    # bytearray: a writable copy, so torch does not warn about a read-only buffer.
    return torch.frombuffer(bytearray(stdlib_bytes(max_bytes)), dtype=torch.uint8).to(torch.int64)


# --- synthetic ------------------------------------------------------------------------

# The synthetic stream is a sequence of "words" drawn i.i.d. from a Zipf law over a
# seeded random lexicon; each word is a fixed random run of 2..8 tokens. A model can
# lower its loss by learning word frequencies and spellings, so loss curves separate
# precisions, unlike uniform random tokens whose loss is stuck at log(vocab).
_ZIPF_EXPONENT = 1.1
_WORD_LENGTHS = (2, 8)


def _lexicon(vocab_size: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(spellings concatenated, start of each word, length of each word, Zipf probabilities)."""
    rng = np.random.default_rng([seed, vocab_size])
    n_words = min(max(vocab_size, 64), 4096)
    lengths = rng.integers(_WORD_LENGTHS[0], _WORD_LENGTHS[1] + 1, size=n_words)
    spellings = rng.integers(0, vocab_size, size=int(lengths.sum()))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    probs = 1.0 / np.arange(1, n_words + 1) ** _ZIPF_EXPONENT
    return spellings, starts, lengths, probs / probs.sum()


def synthetic_tokens(n_tokens: int, vocab_size: int, seed: int) -> torch.Tensor:
    """A seeded stream of ``n_tokens`` tokens in ``[0, vocab_size)`` with learnable structure.

    Same ``(n_tokens, vocab_size, seed)`` gives the same stream. Its entropy rate is at
    most :func:`synthetic_entropy_bound` nats per token.
    """
    spellings, starts, lengths, probs = _lexicon(vocab_size, seed)
    rng = np.random.default_rng([seed, vocab_size, 1])
    # Every word has >= 2 tokens, so n_tokens // 2 + 1 words always cover the stream.
    words = rng.choice(len(probs), size=n_tokens // _WORD_LENGTHS[0] + 1, p=probs)
    word_lens = lengths[words]
    # Position of each output token inside its word, then its index into `spellings`.
    word_first = np.repeat(np.cumsum(word_lens) - word_lens, word_lens)
    index = np.repeat(starts[words], word_lens) + (np.arange(word_first.size) - word_first)
    return torch.from_numpy(spellings[index[:n_tokens]].astype(np.int64))


def synthetic_entropy_bound(vocab_size: int, seed: int) -> float:
    """Upper bound on the synthetic stream's entropy rate, in nats per token.

    The stream is a function of the i.i.d. word sequence, so its entropy rate is at
    most H(word) / E[word length]: the loss floor a perfect model could reach.
    """
    _, _, lengths, probs = _lexicon(vocab_size, seed)
    word_entropy = -float(np.sum(probs * np.log(probs)))
    return word_entropy / float(np.sum(probs * lengths))


# --- token files ------------------------------------------------------------------------


def _load_token_file(path: Path, dtype: str, max_tokens: int | None) -> torch.Tensor:
    if dtype not in TOKEN_DTYPES:
        raise DataError(f"unknown dtype {dtype!r}; valid: {', '.join(TOKEN_DTYPES)}", field="data.dtype")
    if not path.is_file():
        raise DataError(f"not a file: {path}", field="data.path")
    array = _open_npy(path) if path.suffix == ".npy" else _open_bin(path, TOKEN_DTYPES[dtype])
    if max_tokens is not None:
        array = array[:max_tokens]  # slice the memmap first: only these pages are read
    return torch.from_numpy(np.array(array, dtype=np.int64))


def _open_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"cannot read {path} as .npy: {exc}", field="data.path") from None
    if not isinstance(array, np.ndarray):  # an .npz archive under an .npy name
        raise DataError(f"{path} is not a single .npy array (an .npz archive?)", field="data.path")
    if not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{path} holds {array.dtype}, not integer token ids", field="data.path")
    return array.reshape(-1)


def _open_bin(path: Path, dtype: type[np.integer]) -> np.ndarray:
    size, itemsize = path.stat().st_size, np.dtype(dtype).itemsize
    if size % itemsize:
        raise DataError(
            f"{path} is {size} bytes, not a whole number of {np.dtype(dtype).name} tokens", field="data.dtype"
        )
    if size == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


# --- text -------------------------------------------------------------------------------


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
    """Token ids of each text with a local tokenizer; never downloads (:func:`precsearch.probe.tokenize.encode`)."""
    return encode(texts, tokenizer)


# --- batches ----------------------------------------------------------------------------


def _check_batch_args(tokens: torch.Tensor, **sizes: int) -> None:
    """Programming errors (the config schema already bounds these), hence ValueError."""
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    for name, value in sizes.items():
        least = 1 if name in ("seq_len", "micro_batch") else 0
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")


#: Share of the stream held out for evaluation (when it exceeds what the eval batches need).
HELD_OUT_FRACTION = 0.05


class TokenBatches:
    """Deterministic training batches and a fixed held-out set from one token stream.

    The end of the stream is held out: ``HELD_OUT_FRACTION`` of it, and at least
    ``eval_batches * micro_batch * seq_len + 1`` tokens. Training windows are drawn
    only from the tokens before it, so the two never overlap. The held-out windows
    are spread evenly over the held-out part (not packed at its start) so that the
    loss gap is measured on varied text, not on one file. They depend only on the
    stream, not on ``seed``, so every trial is scored on the same tokens.
    """

    def __init__(
        self, tokens: torch.Tensor, *, seq_len: int, micro_batch: int, seed: int, eval_batches: int = 4
    ):
        _check_batch_args(tokens, seq_len=seq_len, micro_batch=micro_batch, seed=seed, eval_batches=eval_batches)
        self.seq_len, self.micro_batch = seq_len, micro_batch
        self.seed, self.eval_batches = seed, eval_batches
        need = eval_batches * micro_batch * seq_len + 1 if eval_batches else 0
        tail = max(need, int(HELD_OUT_FRACTION * tokens.numel())) if eval_batches else 0
        #: Index of the first held-out token; training windows end before it.
        self.eval_start = tokens.numel() - tail
        if self.eval_start < seq_len + 1:
            raise DataError(
                f"{tokens.numel()} tokens are too few: need seq_len + 1 = {seq_len + 1} for training "
                f"plus {tail} held out ({eval_batches} eval batches of {micro_batch} x {seq_len})",
                field="data",
            )
        self.tokens = tokens.long()
        self._eval: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def with_seed(self, seed: int) -> "TokenBatches":
        """The same stream and held-out set with the training windows drawn from ``seed`` (tokens shared)."""
        other = object.__new__(TokenBatches)
        other.__dict__.update(self.__dict__, seed=seed)
        return other

    @property
    def max_offset(self) -> int:
        """Largest start index of a training window."""
        return self.eval_start - self.seq_len - 1

    def train_offsets(self, step: int) -> torch.Tensor:
        """Start indices of the ``micro_batch`` windows of ``step`` (a function of seed and step)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        # SeedSequence mixes (seed, step) so nearby seeds and steps give unrelated draws.
        mixed = int(np.random.SeedSequence([self.seed, step]).generate_state(1, dtype=np.uint64)[0])
        gen = torch.Generator().manual_seed(mixed)
        return torch.randint(0, self.max_offset + 1, (self.micro_batch,), generator=gen)

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)``, each ``(micro_batch, seq_len)`` int64; targets are inputs shifted by one."""
        return self._windows(self.train_offsets(step))

    def eval_set(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``eval_batches`` held-out ``(inputs, targets)`` batches, spread over the held-out tail."""
        if self._eval is None and self.eval_batches == 0:
            self._eval = []  # split() of empty tensors would give one empty batch
        if self._eval is None:
            n_windows = self.eval_batches * self.micro_batch
            last = self.tokens.numel() - self.seq_len - 1
            offsets = torch.linspace(self.eval_start, last, n_windows).long()
            inputs, targets = self._windows(offsets)
            self._eval = list(
                zip(inputs.split(self.micro_batch), targets.split(self.micro_batch), strict=True)
            )
        return self._eval

    def _windows(self, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = offsets[:, None] + torch.arange(self.seq_len + 1)
        windows = self.tokens[index]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


__all__ = [
    "DEFAULT_STDLIB_BYTES",
    "SOURCES",
    "TOKEN_DTYPES",
    "TokenBatches",
    "check_data",
    "load_batches",
    "load_tokens",
    "stdlib_bytes",
    "stdlib_tokens",
    "synthetic_entropy_bound",
    "synthetic_tokens",
]


def load_batches(space: "Space") -> TokenBatches:
    """The space's token stream as deterministic training batches plus the fixed held-out set.

    Raises:
        DataError: naming the data file (or source) and the field to change.
    """
    d, p = space.data, space.probe
    tokens = load_tokens(d.source.value, path=d.path, tokenizer=d.tokenizer, dtype=d.dtype,
                         max_tokens=d.max_tokens, seed=p.seed, vocab_size=space.model.probe().vocab_size,
                         field=d.field)
    try:
        return TokenBatches(tokens, seq_len=p.seq_len, micro_batch=p.micro_batch, seed=p.seed,
                            eval_batches=d.eval_batches)
    except DataError as exc:
        where = d.path if d.path is not None else f"the {d.source.value} stream"
        limited = d.max_tokens is not None and tokens.numel() == d.max_tokens
        raise DataError(f"{where}: {exc.detail}; give more tokens or lower probe.seq_len, probe.micro_batch or "
                        f"data.eval_batches", field="data.max_tokens" if limited else
                        "data.path" if d.path is not None else "data.source") from None


def check_data(space: "Space") -> None:
    """Read the space's data once as a probe would, so that a bad file stops the run before any trial.

    Costs one load of the stream (what each probe process does at its start).

    Raises:
        DataError: naming the data file (or source) and the field to change.
    """
    load_batches(space)
