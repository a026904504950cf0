"""Tests for the probe's token sources and batching."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from precsearch.errors import DataError
from precsearch.probe.data import (
    TokenBatches,
    load_tokens,
    stdlib_bytes,
    synthetic_entropy_bound,
    synthetic_tokens,
)


def _conditional_entropy(tokens: torch.Tensor, vocab_size: int) -> float:
    """Empirical H(next | previous) in nats."""
    prev, nxt = tokens[:-1].numpy(), tokens[1:].numpy()
    pair_counts = np.unique(prev * vocab_size + nxt, return_counts=True)[1]
    prev_counts = np.unique(prev, return_counts=True)[1]

    def entropy(counts: np.ndarray) -> float:
        p = counts / counts.sum()
        return float(-(p * np.log(p)).sum())

    return entropy(pair_counts) - entropy(prev_counts)


# --- stdlib ---------------------------------------------------------------------------


def test_stdlib_is_real_python_source():
    tokens = load_tokens("stdlib", max_tokens=1_000_000)
    assert tokens.dtype == torch.int64 and tokens.dim() == 1
    assert tokens.numel() == 1_000_000
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 256
    text = bytes(tokens.to(torch.uint8).tolist())
    assert b"def " in text and b"import " in text


def test_stdlib_is_a_stable_prefix_and_cached():
    small = stdlib_bytes(10_000)
    assert stdlib_bytes(10_000) is small  # cached in-process
    assert stdlib_bytes(100_000).startswith(small)


def test_stdlib_default_cap_and_vocab_check():
    tokens = load_tokens("stdlib", vocab_size=256)
    assert tokens.numel() > 1_000_000
    with pytest.raises(DataError) as err:
        load_tokens("stdlib", max_tokens=10_000, vocab_size=100)
    assert err.value.field == "data.source"
    assert "vocab_size 100" in str(err.value)


# --- synthetic ------------------------------------------------------------------------


def test_synthetic_is_deterministic_per_seed():
    a = load_tokens("synthetic", seed=1, max_tokens=50_000, vocab_size=256)
    b = load_tokens("synthetic", seed=1, max_tokens=50_000, vocab_size=256)
    c = load_tokens("synthetic", seed=2, max_tokens=50_000, vocab_size=256)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.numel() == 50_000 and int(a.max()) < 256 and int(a.min()) >= 0


@pytest.mark.parametrize("vocab_size", [256, 128256])
def test_synthetic_has_learnable_structure(vocab_size: int):
    tokens = synthetic_tokens(200_000, vocab_size, seed=0)
    assert int(tokens.max()) < vocab_size
    # Far below log(vocab) (uniform tokens), so the loss of a model can fall.
    assert _conditional_entropy(tokens, vocab_size) < 0.4 * math.log(vocab_size)
    assert synthetic_entropy_bound(vocab_size, seed=0) < 0.25 * math.log(vocab_size)


# --- token files ----------------------------------------------------------------------


def test_npy_round_trip(tmp_path: Path):
    ids = np.arange(1000, dtype=np.uint32) * 7 % 50000
    np.save(tmp_path / "ids.npy", ids)
    tokens = load_tokens("tokens", path=tmp_path / "ids.npy", vocab_size=50000)
    assert tokens.dtype == torch.int64
    assert tokens.tolist() == ids.tolist()
    assert load_tokens("tokens", path=tmp_path / "ids.npy", max_tokens=10).tolist() == ids[:10].tolist()


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int32", "int64"])
def test_bin_round_trip(tmp_path: Path, dtype: str):
    ids = (np.arange(3000) * 13 % 60000).astype(dtype)
    ids.tofile(tmp_path / "ids.bin")
    tokens = load_tokens("tokens", path=tmp_path / "ids.bin", dtype=dtype)
    assert tokens.tolist() == ids.tolist()


def test_bin_large_ids_survive_as_int64(tmp_path: Path):
    ids = np.array([0, 65535, 128255, 1], dtype=np.uint32)
    ids.tofile(tmp_path / "ids.bin")
    assert load_tokens("tokens", path=tmp_path / "ids.bin", dtype="uint32").tolist() == ids.tolist()


# --- text -----------------------------------------------------------------------------

_LINES = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog"]


def _word_level_tokenizer(path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(_LINES, tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(path))
    return path


def test_text_with_tokenizer_json(tmp_path: Path):
    (tmp_path / "a.txt").write_text(_LINES[0] + "\n")
    (tmp_path / "b.txt").write_text("\n".join(_LINES[1:]) + "\n")
    tok_path = _word_level_tokenizer(tmp_path / "tokenizer.json")
    tokens = load_tokens("text", path=tmp_path, tokenizer=tok_path)
    n_words = sum(len(line.split()) for line in _LINES)
    assert tokens.numel() == n_words
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok_path)).get_vocab()
    assert tokens[:6].tolist() == [vocab[w] for w in _LINES[0].split()]
    assert int(tokens.max()) < len(vocab)


def test_text_without_tokenizer_is_bytes(tmp_path: Path):
    (tmp_path / "a.txt").write_bytes(b"abc")
    (tmp_path / "b.txt").write_bytes(b"xyz")
    (tmp_path / "ignored.md").write_bytes(b"not text")
    assert bytes(load_tokens("text", path=tmp_path).tolist()) == b"abc\nxyz"
    assert bytes(load_tokens("text", path=tmp_path / "b.txt").tolist()) == b"xyz"


# --- errors ---------------------------------------------------------------------------


def _field_of(**kwargs) -> str | None:
    with pytest.raises(DataError) as err:
        load_tokens(**kwargs)
    return err.value.field


def test_errors_name_the_field(tmp_path: Path):
    ids = np.arange(100, dtype=np.uint16)
    ids.tofile(tmp_path / "ids.bin")
    np.save(tmp_path / "floats.npy", np.ones(10, dtype=np.float32))
    (tmp_path / "odd.bin").write_bytes(b"\x00\x01\x02")
    (tmp_path / "one.bin").write_bytes(b"\x01\x00")
    (tmp_path / "empty").mkdir()
    assert _field_of(source="bogus") == "data.source"
    assert _field_of(source="tokens") == "data.path"
    assert _field_of(source="tokens", path=tmp_path / "missing.bin") == "data.path"
    assert _field_of(source="tokens", path=tmp_path / "ids.bin", dtype="float32") == "data.dtype"
    assert _field_of(source="tokens", path=tmp_path / "odd.bin") == "data.dtype"
    assert _field_of(source="tokens", path=tmp_path / "floats.npy") == "data.path"
    assert _field_of(source="tokens", path=tmp_path / "ids.bin", vocab_size=50) == "data.path"
    assert _field_of(source="tokens", path=tmp_path / "one.bin") == "data.path"  # too few tokens
    assert _field_of(source="stdlib", max_tokens=1) == "data.max_tokens"
    assert _field_of(source="text", path=tmp_path / "empty") == "data.path"
    text = tmp_path / "ids.bin"
    assert _field_of(source="text", path=text, tokenizer=tmp_path / "nope.json") == "data.tokenizer"
    (tmp_path / "bad.json").write_text("{not json")
    assert _field_of(source="text", path=text, tokenizer=tmp_path / "bad.json") == "data.tokenizer"


def test_negative_ids_are_refused(tmp_path: Path):
    np.array([1, -2, 3], dtype=np.int32).tofile(tmp_path / "neg.bin")
    with pytest.raises(DataError, match="negative"):
        load_tokens("tokens", path=tmp_path / "neg.bin", dtype="int32")


# --- batches --------------------------------------------------------------------------


def _batches(seed: int = 0, n: int = 10_000, **kwargs) -> TokenBatches:
    settings = {"seq_len": 32, "micro_batch": 4, "eval_batches": 3} | kwargs
    return TokenBatches(torch.arange(n), seed=seed, **settings)


def test_train_batch_shapes_and_shift():
    inputs, targets = _batches().train_batch(0)
    assert inputs.shape == targets.shape == (4, 32)
    assert inputs.dtype == targets.dtype == torch.int64
    # The stream is arange, so a shifted window is the window plus one.
    assert torch.equal(targets, inputs + 1)
    assert torch.equal(inputs[:, 1:], inputs[:, :-1] + 1)


def test_train_batches_are_deterministic_per_seed_and_step():
    a, b, c = _batches(seed=1), _batches(seed=1), _batches(seed=2)
    for step in (0, 1, 57):
        assert torch.equal(a.train_batch(step)[0], b.train_batch(step)[0])
    assert not torch.equal(a.train_batch(0)[0], a.train_batch(1)[0])
    assert not torch.equal(a.train_batch(0)[0], c.train_batch(0)[0])


def test_eval_set_is_fixed_and_disjoint_from_training():
    a, b = _batches(seed=1), _batches(seed=9)
    eval_a = a.eval_set()
    assert len(eval_a) == 3
    for (xa, ya), (xb, yb) in zip(eval_a, b.eval_set(), strict=True):
        assert xa.shape == (4, 32)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    eval_tokens = torch.cat([torch.cat((x, y), dim=1).flatten() for x, y in eval_a])
    assert int(eval_tokens.min()) == a.eval_start
    assert int(eval_tokens.max()) == 9_999  # the tail runs to the end of the stream
    for step in range(200):
        inputs, targets = a.train_batch(step)
        assert int(targets.max()) < a.eval_start  # every token, targets included, is before the tail


def test_windows_reach_the_end_of_the_training_part():
    batches = _batches(n=3 * 4 * 32 + 1 + 34)  # exactly two possible training offsets
    assert batches.max_offset == 1
    seen = {int(o) for step in range(50) for o in batches.train_offsets(step)}
    assert seen == {0, 1}


def test_no_eval_batches():
    batches = _batches(n=100, eval_batches=0)
    assert batches.eval_set() == []
    assert batches.max_offset == 100 - 33


def test_too_short_stream_is_a_data_error():
    with pytest.raises(DataError, match="too few"):
        _batches(n=3 * 4 * 32 + 1 + 32)
    with pytest.raises(DataError):
        TokenBatches(torch.arange(10), seq_len=10, micro_batch=1, seed=0, eval_batches=0)


def test_bad_batch_arguments_are_value_errors():
    with pytest.raises(ValueError, match="seq_len"):
        TokenBatches(torch.arange(100), seq_len=0, micro_batch=1, seed=0)
    with pytest.raises(ValueError, match="1-D"):
        TokenBatches(torch.zeros(2, 50, dtype=torch.long), seq_len=4, micro_batch=1, seed=0)
    with pytest.raises(ValueError, match="step"):
        _batches().train_batch(-1)
