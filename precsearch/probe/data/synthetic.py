"""Source ``synthetic``: a seeded stream with learnable structure, for tests and smoke runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from precsearch.probe.data.request import TokenRequest

if TYPE_CHECKING:
    import torch

#: Length of the ``synthetic`` stream when ``max_tokens`` is not given.
DEFAULT_SYNTHETIC_TOKENS = 2**20
#: Vocabulary of the ``synthetic`` stream when ``vocab_size`` is not given (byte-sized).
DEFAULT_SYNTHETIC_VOCAB = 256


def read(request: TokenRequest) -> np.ndarray:
    """``max_tokens`` tokens (:data:`DEFAULT_SYNTHETIC_TOKENS` without a cap) over the model's vocabulary."""
    n_tokens = DEFAULT_SYNTHETIC_TOKENS if request.max_tokens is None else request.max_tokens
    return _synthetic_array(n_tokens, request.vocab_size or DEFAULT_SYNTHETIC_VOCAB, request.seed)


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
    import torch

    return torch.from_numpy(_synthetic_array(n_tokens, vocab_size, seed))


def _synthetic_array(n_tokens: int, vocab_size: int, seed: int) -> np.ndarray:
    spellings, starts, lengths, probs = _lexicon(vocab_size, seed)
    rng = np.random.default_rng([seed, vocab_size, 1])
    # Every word has >= 2 tokens, so n_tokens // 2 + 1 words always cover the stream.
    words = rng.choice(len(probs), size=n_tokens // _WORD_LENGTHS[0] + 1, p=probs)
    word_lens = lengths[words]
    # Position of each output token inside its word, then its index into `spellings`.
    word_first = np.repeat(np.cumsum(word_lens) - word_lens, word_lens)
    index = np.repeat(starts[words], word_lens) + (np.arange(word_first.size) - word_first)
    return spellings[index[:n_tokens]].astype(np.int64)


def synthetic_entropy_bound(vocab_size: int, seed: int) -> float:
    """Upper bound on the synthetic stream's entropy rate, in nats per token.

    The stream is a function of the i.i.d. word sequence, so its entropy rate is at
    most H(word) / E[word length]: the loss floor a perfect model could reach.
    """
    _, _, lengths, probs = _lexicon(vocab_size, seed)
    word_entropy = -float(np.sum(probs * np.log(probs)))
    return word_entropy / float(np.sum(probs * lengths))
