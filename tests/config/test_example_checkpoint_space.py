"""The shipped checkpoint example (``search_spaces/from_checkpoint_h100.yaml``), given a tiny checkpoint,
tokenizer and JSONL file at the places it names, validates: every path resolves against the space file,
the target is the checkpoint's full model, the probe takes the blocks ``spread`` picks, and the data is
tokenized and checked against the checkpoint's vocabulary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _checkpoints import hf_llama, save_checkpoint
from precsearch.arch.hf_checkpoint import check_checkpoint
from precsearch.config.checks import check_space
from precsearch.config.loader import load_space
from precsearch.errors import UserError
from precsearch.probe.data import check_data

EXAMPLE = Path(__file__).resolve().parents[2] / "search_spaces" / "from_checkpoint_h100.yaml"


@pytest.fixture()
def laid_out(tmp_path) -> Path:
    """tmp/search_spaces/<example>, tmp/checkpoints/llama3.2-1b/ (5 tiny blocks + tokenizer), tmp/data/train.jsonl."""
    tokenizers = pytest.importorskip("tokenizers")
    (tmp_path / "search_spaces").mkdir()
    space = tmp_path / "search_spaces" / EXAMPLE.name
    shutil.copy(EXAMPLE, space)
    ckpt = save_checkpoint(hf_llama(max_position_embeddings=4096), tmp_path / "checkpoints" / "llama3.2-1b",
                           shard="60KB")
    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "quick", "brown", "fox", "jumps"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"text": "the quick brown fox jumps " * 2000}) + "\n" for _ in range(12)))
    return space


def test_example_space_validates_against_its_checkpoint(laid_out):
    space = load_space(laid_out)
    check_space(space, file=str(laid_out))  # te / cuda are not on this machine
    start = space.model.start()
    assert space.model.target().n_layers == 5 and space.model.probe().n_layers == 4
    assert start.layers == (0, 1, 3, 4)  # spread over 5 blocks
    check_checkpoint(start.path, start.layers)
    check_data(space)


def test_example_space_without_its_checkpoint_names_init_from(laid_out):
    shutil.rmtree(laid_out.parent.parent / "checkpoints")
    with pytest.raises(UserError) as info:
        check_space(load_space(laid_out), file=str(laid_out))
    assert info.value.field == "model.init_from" and "llama3.2-1b" in str(info.value)
