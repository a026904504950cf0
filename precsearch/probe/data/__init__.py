"""Token streams for the probe, and the batches cut from them.

Sources (``data.source``), one module each, listed in :data:`~precsearch.probe.data.sources.READERS`:

* ``stdlib`` (:mod:`.stdlib`): the Python standard library's own ``.py`` files as bytes
  (tokens 0..255). Real text that exists offline on every machine.
* ``synthetic`` (:mod:`.synthetic`): a seeded stream with learnable structure, for tests and
  smoke runs.
* ``tokens`` (:mod:`.token_file`): a pre-tokenized ``.npy`` file, or a raw ``.bin`` of ``dtype``.
* ``text`` (:mod:`.text`): a ``.txt`` file or a directory of them, tokenized by a local
  tokenizer (a ``tokenizer.json``, a Hugging Face tokenizer directory, or a GGUF file's own
  tokenizer), or taken as bytes when
  no tokenizer is given. Nothing is ever downloaded.
* ``megatron`` (:mod:`.megatron`): a Megatron-Core indexed dataset (``prefix.bin`` + ``prefix.idx``),
  read with numpy memmap.
* ``hf_disk`` (:mod:`.hf_disk`): a Hugging Face dataset saved with ``save_to_disk`` (Arrow shards,
  read with pyarrow), column ``data.field``.
* ``jsonl`` (:mod:`.jsonl`): JSON Lines, the document under ``data.field``.

Texts of ``text``, ``jsonl`` and ``hf_disk`` are tokenized by :mod:`.tokenizer` (``tokenizer.json``,
a tokenizer directory, a tiktoken-style ``tokenizer.model``, or a ``.gguf`` file: :mod:`.gguf_tokenizer`).

:class:`~.batches.TokenBatches` splits a stream into a training part and a fixed held-out tail,
and cuts deterministic batches from them (:mod:`.split` says where the held-out tail starts).

Reading and checking a stream (:func:`load_tokens` aside, which returns a tensor) needs no torch, so
importing this package imports none: :class:`TokenBatches` is loaded on first use.
"""

from precsearch.probe.data.split import HELD_OUT_FRACTION
from precsearch.probe.data.sources import MIN_TOKENS, READERS, SOURCES, check_data, load_batches, load_tokens
from precsearch.probe.data.stdlib import DEFAULT_STDLIB_BYTES, stdlib_bytes, stdlib_tokens
from precsearch.probe.data.synthetic import (DEFAULT_SYNTHETIC_TOKENS, DEFAULT_SYNTHETIC_VOCAB,
                                             synthetic_entropy_bound, synthetic_tokens)
from precsearch.probe.data.token_file import TOKEN_DTYPES

__all__ = [
    "DEFAULT_STDLIB_BYTES",
    "DEFAULT_SYNTHETIC_TOKENS",
    "DEFAULT_SYNTHETIC_VOCAB",
    "HELD_OUT_FRACTION",
    "MIN_TOKENS",
    "READERS",
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


def __getattr__(name: str):
    if name == "TokenBatches":  # batches are tensors: torch is imported when they are asked for
        from precsearch.probe.data.batches import TokenBatches

        return TokenBatches
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
