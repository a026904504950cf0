"""A Llama GGUF file as ``model.init_from``: its shape from the metadata, its tensors read back exactly.

The files are written here with the gguf package's own writer and quantiser, laid out as llama.cpp's
converter lays out a Hugging Face Llama (tests/_gguf.py). A tensor that comes back different means a
wrong dequantisation, a transposed tensor or llama.cpp's Q/K row order not undone (then RoPE rotates
the wrong pairs and the model is silently another). Every refusal must be a UserError naming
``model.init_from``, the file and the tensor or key.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from _gguf import SHAPE, hf_state, write_llama_gguf
from precsearch.arch import checkpoint, gguf_checkpoint
from precsearch.arch.gguf_checkpoint import check_checkpoint, read_config, read_tensors, tied_embeddings
from precsearch.errors import UserError

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_llama_gguf(path, hf_state())


def _raises(path: Path, *words: str, layers=(0, 1)) -> None:
    with pytest.raises(UserError) as info:
        checkpoint.check_checkpoint(path, layers)
    assert info.value.field == "model.init_from"
    assert len(str(info.value).splitlines()) == 1
    for word in (str(path), *words):
        assert word in str(info.value), str(info.value)


def test_metadata_gives_the_full_shape(written):
    path, _ = written
    cfg = checkpoint.read_config(path)  # the format is found from the path
    # GQA heads, FFN size, vocabulary, theta or eps read wrong would build another model than the file's
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim) == (320, 576, 2, 9, 3,
                                                                                                   256)
    assert cfg.head_dim == 64 and cfg.rope_theta == 100000.0 and cfg.max_seq_len == 2048 and cfg.rope_scaling is None
    assert cfg.norm_eps == pytest.approx(1e-5)  # stored as a float32
    assert tied_embeddings(path)


def test_every_tensor_reads_back_exactly(written):
    """Float32, float16, Q8_0 and Q4_1 tensors, q/k in Hugging Face row order; a tied head is the embedding."""
    path, expected = written
    needed = check_checkpoint(path, (0, 1))
    assert {needed[f"model.layers.1.{k}"].dtype for k in ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                          "mlp.gate_proj.weight", "mlp.up_proj.weight")} == {
        "Q8_0", "F16", "Q4_1", "F32"}
    got = read_tensors(path, tuple(needed))
    for name, value in got.items():
        want = expected["model.embed_tokens.weight" if name == "lm_head.weight" else name]
        assert value.dtype == np.float32 and value.shape == want.shape, name
        np.testing.assert_array_equal(value, want, err_msg=name)
    # the quantised types really are lossy, so exactness above is not a float32 file read twice
    original = hf_state()["model.layers.0.mlp.gate_proj.weight"]
    assert not np.array_equal(got["model.layers.0.mlp.gate_proj.weight"], original)


def test_untied_output_layer_is_read(tmp_path):
    state = hf_state(seed=1, tied=False)
    expected = write_llama_gguf(tmp_path / "untied.gguf", state)
    assert not tied_embeddings(tmp_path / "untied.gguf")
    got = read_tensors(tmp_path / "untied.gguf", ("lm_head.weight",))
    np.testing.assert_array_equal(got["lm_head.weight"], expected["lm_head.weight"])
    assert not np.array_equal(got["lm_head.weight"], expected["model.embed_tokens.weight"])


def test_non_llama_file_is_refused(tmp_path):
    path = tmp_path / "qwen.gguf"
    write_llama_gguf(path, hf_state(blocks=1), arch="qwen2", blocks=1)
    _raises(path, "general.architecture", "'qwen2'", "only Llama")


def test_unsupported_quantisation_names_the_tensor(tmp_path):
    """IQ2_XXS (an importance-matrix type of llama.cpp's) is not among the types read."""
    gguf = pytest.importorskip("gguf")
    from _gguf import gguf_name, write_metadata

    path = tmp_path / "iq.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    write_metadata(writer, SHAPE | {"blocks": 1})
    kind = gguf.GGMLQuantizationType.IQ2_XXS  # blocks of 256 values: ffn_down's rows hold 256
    for hf, value in hf_state(blocks=1).items():
        if hf.endswith("down_proj.weight"):
            raw = np.zeros(gguf.quants.quant_shape_to_byte_shape(value.shape, kind), np.uint8)
            writer.add_tensor(gguf_name(hf), raw, raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name(hf), value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _raises(path, "blk.0.ffn_down.weight", "IQ2_XXS", "valid:", "Q4_1", layers=(0,))


def test_truncated_file_names_the_tensor_cut_off(tmp_path, written):
    path = tmp_path / "cut.gguf"
    path.write_bytes(written[0].read_bytes()[:-5000])
    _raises(path, "truncated", "blk.1.ffn_down.weight")  # the last tensor written
    path.write_bytes(written[0].read_bytes()[:200])
    _raises(path, "truncated in its header")


def test_missing_and_misshapen_tensors_are_named(tmp_path):
    state = hf_state()
    del state["model.layers.1.mlp.up_proj.weight"]
    write_llama_gguf(tmp_path / "missing.gguf", state)
    _raises(tmp_path / "missing.gguf", "blk.1.ffn_up.weight", "missing")
    check_checkpoint(tmp_path / "missing.gguf", (0,))  # a block the probe does not take may be incomplete
    write_llama_gguf(tmp_path / "ffn.gguf", hf_state(), ffn=288)  # metadata says 288, the tensors hold 256
    _raises(tmp_path / "ffn.gguf", "blk.0.ffn_gate.weight", "[256, 576]", "[288, 576]")


def test_not_a_gguf_and_no_file_are_clear(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    _raises(tmp_path / "model.gguf", "not a GGUF file")
    _raises(tmp_path / "absent.gguf", "no such GGUF file", "nothing is downloaded")
    # a corrupt count (an array of 2**60 bytes) is a truncated header, not a huge allocation
    key = b"general.languages"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 0, 2**60)
    (tmp_path / "huge.gguf").write_bytes(head)
    _raises(tmp_path / "huge.gguf", "truncated in its header", "general.languages")


def test_missing_gguf_package_names_the_extra(tmp_path, written, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    gguf_checkpoint._cached.cache_clear()
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(written[0].read_bytes())
    _raises(copy, "gguf package", "pip install 'precsearch[gguf]'")


def test_space_with_a_gguf_validates_and_refuses_a_bad_one(tmp_path, written, capsys):
    """``precsearch validate`` accepts a space starting from a GGUF and exits 2 naming a non-Llama file."""
    from _spaces import tiny_space_dict, write_space
    from precsearch.cli import main

    data = tiny_space_dict()
    data["model"] = {"init_from": str(written[0]), "probe_layers": 1, "probe_layer_pick": "last"}
    assert main(["validate", str(write_space(tmp_path, data))]) == 0, capsys.readouterr().err
    write_llama_gguf(tmp_path / "other.gguf", hf_state(blocks=1), arch="gpt2", blocks=1)
    data["model"]["init_from"] = "other.gguf"  # relative to the space file
    capsys.readouterr()
    assert main(["validate", str(write_space(tmp_path, data))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    for word in ("space.yaml", "model.init_from", str(tmp_path / "other.gguf"), "general.architecture"):
        assert word in err, err
