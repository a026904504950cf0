"""The tokenizer a llama.cpp GGUF file carries in its metadata, built as a ``tokenizers.Tokenizer``.

llama.cpp's converter keeps a byte-level BPE tokenizer (``tokenizer.ggml.model`` ``gpt2``) as:

- ``tokenizer.ggml.tokens``: every token, spelled in GPT-2's byte alphabet; its index is its id;
- ``tokenizer.ggml.merges``: the merges, ``"left right"``, highest priority first;
- ``tokenizer.ggml.token_type``: per token, 1 normal, 3 control (``<|endoftext|>``), 4 user-defined, ...;
- ``tokenizer.ggml.pre``: the name of the pre-tokenizer, i.e. how llama.cpp cuts text before the merges.

The pre-tokenizer is built from what llama.cpp does for that name (:data:`PRE_SPLITS`): a sequence of
split patterns, each piece of one cut again by the next, then the byte alphabet. Control and
user-defined tokens are matched whole in the text, as llama.cpp and transformers' converter do (the
texts of a data set rarely hold them). Reading needs the ``gguf`` and ``tokenizers`` packages
(``pip install "precsearch[text,gguf]"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from precsearch.errors import DataError
from precsearch.probe.data.split_patterns import GPT2_PATTERN, LLAMA3_PATTERN

FIELD = "data.tokenizer"
#: ``tokenizer.ggml.model`` values read: byte-level BPE. SentencePiece (``llama``) and others are refused.
MODELS = ("gpt2",)
#: ``tokenizer.ggml.pre`` -> the split patterns llama.cpp applies in turn (``llama-vocab.cpp``).
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "smollm": (r"\p{N}", GPT2_PATTERN),  # SmolLM / SmolLM2: each digit alone, then GPT-2's pattern
    "llama-bpe": (LLAMA3_PATTERN,),  # Llama 3 (llama.cpp's converter writes this name)
    "llama3": (LLAMA3_PATTERN,),  # older names llama.cpp reads as Llama 3's
    "llama-v3": (LLAMA3_PATTERN,),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types


def _packages(path: Path) -> tuple[Any, Any]:
    try:
        import gguf  # optional: only a GGUF tokenizer needs them
        import tokenizers
    except ImportError as exc:
        raise DataError(f"{path}: reading a GGUF file's tokenizer needs the '{exc.name}' package: "
                        f"pip install \"precsearch[text,gguf]\"", field=FIELD) from None
    return gguf, tokenizers


def read_metadata(path: Path) -> dict[str, Any]:
    """The file's ``tokenizer.ggml.*`` metadata, values decoded (arrays as lists).

    Raises:
        DataError: the file is not a GGUF file the ``gguf`` package reads, naming the file.
    """
    gguf, _ = _packages(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: not a readable GGUF file ({exc})", field=FIELD) from None
    return {key: field.contents() for key, field in reader.fields.items() if key.startswith("tokenizer.ggml.")}


def _required(meta: dict[str, Any], path: Path, key: str) -> Any:
    if key not in meta:
        raise DataError(f"{path}: metadata {key!r} is missing; the file carries no usable tokenizer", field=FIELD)
    return meta[key]


def _checked_kind(meta: dict[str, Any], path: Path) -> tuple[str, ...]:
    """The split patterns of the file's pre-tokenizer, after checking its model and pre-tokenizer are read."""
    model = _required(meta, path, "tokenizer.ggml.model")
    if model not in MODELS:
        raise DataError(f"{path}: tokenizer.ggml.model is {model!r}; only byte-level BPE is read from a GGUF "
                        f"file (valid: {', '.join(MODELS)}); give the checkpoint's tokenizer.json instead",
                        field=FIELD)
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_SPLITS:
        raise DataError(f"{path}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer not read here (valid: "
                        f"{', '.join(PRE_SPLITS)}); give the checkpoint's tokenizer.json instead", field=FIELD)
    return PRE_SPLITS[pre]


def build_tokenizer(meta: dict[str, Any], path: Path) -> Any:
    """The ``tokenizers.Tokenizer`` that the ``tokenizer.ggml.*`` metadata ``meta`` (of ``path``) describes.

    Raises:
        DataError: naming the file and the metadata key or value that is missing or not read.
    """
    splits = _checked_kind(meta, path)
    _, tk = _packages(path)
    tokens = _required(meta, path, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _required(meta, path, "tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise DataError(f"{path}: tokenizer.ggml.tokens holds a token twice; ids would not be the file's",
                        field=FIELD)
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Split(tk.Regex(p), behavior="isolated") for p in splits]
        + [tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type", ())
    tok.add_special_tokens([tk.AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(tokens, types) if kind == _CONTROL])
    tok.add_tokens([tk.AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(tokens, types) if kind == _USER_DEFINED])
    return tok


def gguf_tokenizer(path: Path) -> Any:
    """The tokenizer of the GGUF file ``path`` (see the module docstring).

    Raises:
        DataError: naming ``data.tokenizer``, the file, and the metadata that is missing or not read.
    """
    path = Path(path)
    return build_tokenizer(read_metadata(path), path)


__all__ = ["MODELS", "PRE_SPLITS", "build_tokenizer", "gguf_tokenizer", "read_metadata"]
