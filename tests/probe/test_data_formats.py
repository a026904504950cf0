"""The users' data formats: Megatron indexed datasets, HF ``save_to_disk`` datasets, JSON Lines, tiktoken ranks.

Good files must give exactly the tokens their writer stored (written here by the writers users run:
Megatron-Core's ``IndexedDatasetBuilder``, ``datasets.Dataset.save_to_disk``); corrupt or mismatched
ones must stop ``precsearch validate`` with exit 2 and one line naming the file and the field.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.errors import DataError
from precsearch.probe.data import load_tokens
from precsearch.probe.data.megatron import read_megatron
from precsearch.probe.data.tokenizer import encode

DOCS = [np.arange(i, i + 700 + 13 * i) % 256 for i in range(12)]  # 12 documents of varied length
STREAM = np.concatenate(DOCS)


def _megatron(d: Path, dtype=np.uint16, docs=DOCS) -> Path:
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    builder = indexed.IndexedDatasetBuilder(str(d / "corpus.bin"), dtype=dtype)
    for doc in docs:
        builder.add_item(torch.from_numpy(doc.astype(np.int64)))
        builder.end_document()
    builder.finalize(str(d / "corpus.idx"))
    return d / "corpus"


def _saved(d: Path, column: dict, dict_of_splits: bool = False) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict(column)
    (datasets.DatasetDict({"train": ds, "test": ds}) if dict_of_splits else ds).save_to_disk(str(d / "ds"))
    return d / "ds"


def _jsonl(d: Path, rows: list) -> Path:
    (d / "docs.jsonl").write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return d / "docs.jsonl"


TEXTS = [f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * (10 + i) for i in range(12)]
TEXT_BYTES = np.frombuffer("".join(TEXTS).encode(), dtype=np.uint8).astype(np.int64)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
@pytest.mark.parametrize("given", ["", ".bin", ".idx"])
def test_megatron_stream_is_the_documents_in_order(tmp_path, dtype, given):
    prefix = _megatron(tmp_path, dtype)
    tokens = load_tokens("megatron", path=Path(f"{prefix}{given}"), vocab_size=256)
    np.testing.assert_array_equal(tokens.numpy(), STREAM)
    np.testing.assert_array_equal(read_megatron(prefix, max_tokens=1000), STREAM[:1000])


def test_hf_disk_texts_and_token_ids(tmp_path):
    path = _saved(tmp_path, {"text": TEXTS, "input_ids": [d.tolist() for d in DOCS]})
    np.testing.assert_array_equal(load_tokens("hf_disk", path=path, field="text").numpy(), TEXT_BYTES)
    np.testing.assert_array_equal(load_tokens("hf_disk", path=path, field="input_ids").numpy(), STREAM)
    splits = _saved(tmp_path / "s", {"input_ids": [d.tolist() for d in DOCS]}, dict_of_splits=True)
    np.testing.assert_array_equal(load_tokens("hf_disk", path=splits, field="input_ids").numpy(), STREAM)


def test_jsonl_texts_and_token_ids(tmp_path):
    path = _jsonl(tmp_path, [{"text": t, "id": i} for i, t in enumerate(TEXTS)])
    np.testing.assert_array_equal(load_tokens("jsonl", path=path).numpy(), TEXT_BYTES)
    ids = _jsonl(tmp_path, [{"ids": d.tolist()} for d in DOCS])
    np.testing.assert_array_equal(load_tokens("jsonl", path=ids, field="ids", max_tokens=900).numpy(), STREAM[:900])


def test_jsonl_is_tokenized_with_a_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"the": 0, "fox": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    path = _jsonl(tmp_path, [{"text": "the fox the dog"}, {"text": "fox"}])
    tokens = load_tokens("jsonl", path=path, tokenizer=tmp_path / "tokenizer.json")
    assert tokens.tolist() == [0, 1, 0, 2, 1]


def test_tokenizer_is_loaded_once_per_file_not_per_chunk(tmp_path, monkeypatch):
    """jsonl/hf_disk encode 256 texts per call; a large dataset must not re-parse the tokenizer each time."""
    tokenizers = pytest.importorskip("tokenizers")
    from precsearch.probe.data import documents

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"the": 0, "fox": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loads = []
    real = tokenizers.Tokenizer.from_file
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file", lambda path: loads.append(path) or real(path))
    monkeypatch.setattr(documents, "CHUNK", 2)
    path = _jsonl(tmp_path, [{"text": "the fox"}] * 7)
    tokens = load_tokens("jsonl", path=path, tokenizer=tmp_path / "tokenizer.json")
    assert tokens.tolist() == [0, 1] * 7
    assert len(loads) == 1, loads  # 4 chunks, one load


def _ranks_file(d: Path) -> Path:
    """Byte-level ranks 0..255, then merges 'th' (256) and 'the' (257): a tiktoken-style tokenizer.model."""
    merges = [bytes([b]) for b in range(256)] + [b"th", b"the"]
    (d / "tokenizer.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(merges)))
    return d / "tokenizer.model"


def test_tiktoken_tokenizer_model(tmp_path):
    pytest.importorskip("tiktoken")
    ids = encode(["the thin"], _ranks_file(tmp_path))[0]
    # "the" merges fully; " thin" is split by Llama 3's pattern into " thin" -> ' ', 'th', 'i', 'n'
    assert ids == [257, ord(" "), 256, ord("i"), ord("n")]


def test_tiktoken_missing_is_a_clear_error(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__",
                        lambda name, *a, **k: (_ for _ in ()).throw(ImportError()) if name == "tiktoken"
                        else real(name, *a, **k))
    with pytest.raises(DataError, match="pip install tiktoken.*tokenizer.json"):
        encode(["x"], _ranks_file(tmp_path))


# --- corrupt and mismatched files: exit 2 at validate, naming file and field ----------------------------


def _bad_magic(d: Path) -> Path:
    prefix = _megatron(d)
    idx = Path(f"{prefix}.idx")
    idx.write_bytes(b"NOTANIDX\x00" + idx.read_bytes()[9:])
    return prefix


def _truncated_bin(d: Path) -> Path:
    prefix = _megatron(d)
    data = Path(f"{prefix}.bin")
    data.write_bytes(data.read_bytes()[:-100])
    return prefix


def _float_idx(d: Path) -> Path:
    prefix = _megatron(d)
    idx = Path(f"{prefix}.idx")
    raw = bytearray(idx.read_bytes())
    raw[17] = 7  # float32
    idx.write_bytes(bytes(raw))
    return prefix


def _truncated_idx(d: Path) -> Path:
    prefix = _megatron(d)
    idx = Path(f"{prefix}.idx")
    idx.write_bytes(idx.read_bytes()[:60])
    return prefix


def _missing_idx(d: Path) -> Path:
    prefix = _megatron(d)
    Path(f"{prefix}.idx").unlink()
    return prefix


def _big_ids_megatron(d: Path) -> Path:
    return _megatron(d, docs=[doc + 100 for doc in DOCS])  # ids up to 355 for a vocab of 256


def _corrupt_arrow(d: Path) -> Path:
    path = _saved(d, {"text": TEXTS})
    shard = next(path.glob("*.arrow"))
    shard.write_bytes(shard.read_bytes()[:300])
    return path


def _not_ids(d: Path) -> Path:
    return _saved(d, {"text": [1.5] * 12})


#: case -> (writes data and returns data.path, data extras, field named, fragment, name of the file named)
CASES = {
    "megatron_bad_magic": (_bad_magic, {"source": "megatron"}, "data.path", "bad magic", "corpus.idx"),
    "megatron_truncated_bin": (_truncated_bin, {"source": "megatron"}, "data.path", "truncated", "corpus.bin"),
    "megatron_truncated_idx": (_truncated_idx, {"source": "megatron"}, "data.path", "truncated", "corpus.idx"),
    "megatron_float_dtype": (_float_idx, {"source": "megatron"}, "data.path", "dtype code 7", "corpus.idx"),
    "megatron_missing_idx": (_missing_idx, {"source": "megatron"}, "data.path", "missing", "corpus.idx"),
    "megatron_ids_beyond_vocab": (_big_ids_megatron, {"source": "megatron"}, "data.path", "token id 355", "corpus"),
    "hf_disk_missing_column": (lambda d: _saved(d, {"text": TEXTS}), {"source": "hf_disk", "field": "input_ids"},
                               "data.field", "no column 'input_ids'", "ds"),
    "hf_disk_wrong_type": (_not_ids, {"source": "hf_disk"}, "data.field", "valid: a string", "ds"),
    "hf_disk_corrupt_arrow": (_corrupt_arrow, {"source": "hf_disk"}, "data.path", "Arrow", ".arrow"),
    "hf_disk_not_saved": (lambda d: (d / "ds").mkdir() or d / "ds", {"source": "hf_disk"}, "data.path",
                          "no state.json", "ds"),
    "jsonl_missing_field": (lambda d: _jsonl(d, [{"text": "a"}, {"body": "b"}]), {"source": "jsonl"}, "data.field",
                            "line 2: no field 'text'", "docs.jsonl"),
    "jsonl_bad_line": (lambda d: _jsonl(d, [{"text": "a"}, "{not json"]), {"source": "jsonl"}, "data.path",
                       "line 2: not JSON", "docs.jsonl"),
    "jsonl_ids_beyond_vocab": (lambda d: _jsonl(d, [{"text": list(range(300))}] * 30), {"source": "jsonl"},
                               "data.path", "token id 299", "docs.jsonl"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_names_the_bad_file_and_field(tmp_path, capsys, case):
    make, extra, field, fragment, named = CASES[case]
    data_path = make(tmp_path)
    space = write_space(tmp_path, tiny_space_dict(data={"path": str(data_path), "eval_batches": 2, **extra}))
    capsys.readouterr()  # what the writers printed
    code = main(["validate", str(space)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{field}: " in err and fragment in err and named in err, err


def test_good_formats_validate(tmp_path, capsys):
    for extra, path in (({"source": "megatron"}, _megatron(tmp_path)),
                        ({"source": "hf_disk", "field": "input_ids"},
                         _saved(tmp_path, {"input_ids": [d.tolist() for d in DOCS]})),
                        ({"source": "jsonl"}, _jsonl(tmp_path, [{"text": t} for t in TEXTS]))):
        space = write_space(tmp_path, tiny_space_dict(data={"path": str(path), "eval_batches": 2, **extra}))
        assert main(["validate", str(space)]) == 0, capsys.readouterr().err


def test_field_without_a_source_that_reads_it_is_refused(tmp_path, capsys):
    space = write_space(tmp_path, tiny_space_dict(data={"source": "stdlib", "field": "text"}))
    assert main(["validate", str(space)]) == 2
    assert "data.field" in capsys.readouterr().err




def test_readers_are_exactly_the_sources_a_space_file_accepts():
    """One list of data sources: the space file's DataSource names are the readers' keys, and its file
    sources are the ones the readers check for a path."""
    from precsearch.config.data_source import FILE_SOURCES, DataSource
    from precsearch.probe.data import sources

    assert set(sources.READERS) == {s.value for s in DataSource}
    assert set(sources.FILE_SOURCES) == {s.value for s in FILE_SOURCES}


def test_hf_disk_state_entry_without_filename_is_named(tmp_path):
    """A state.json entry that names no shard is an error, not a shard silently skipped."""
    from precsearch.probe.data.hf_disk import arrow_files

    path = _saved(tmp_path, {"text": ["a b", "c d"]})
    state = json.loads((path / "state.json").read_text())
    state["_data_files"].append({"file": "data-00001.arrow"})
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(DataError, match=r"state.json.*_data_files\[1\] has no 'filename'"):
        arrow_files(path)
