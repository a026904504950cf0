"""Reading a Hugging Face Llama checkpoint as data: its shape, its tensors, the blocks a probe takes.

Every failure must be a UserError naming ``model.init_from``, the file, and the tensor or field, found
from headers only (before any probe loads a weight).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _checkpoints import TINY, hf_llama, save_checkpoint
from precsearch.arch.hf_checkpoint import (LayerPick, check_checkpoint, pick_layers, read_config,
                                           tensor_index)
from precsearch.errors import UserError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return save_checkpoint(hf_llama(), tmp_path_factory.mktemp("ckpt"))


def test_config_gives_the_full_shape(ckpt):
    cfg = read_config(ckpt)
    # a field read wrong (GQA heads, ffn, eps, rope) would build another model than the checkpoint's
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim) == (256, 64, 5, 4, 2, 160)
    assert cfg.norm_eps == TINY["rms_norm_eps"] and cfg.rope_theta == 500000.0 and cfg.max_seq_len == 512
    assert cfg.rope_scaling.factor == 8.0 and cfg.rope_scaling.original_max_position_embeddings == 64


def test_transformers_4_config_layout_is_read(tmp_path):
    """Older checkpoints (Llama 3.1 as published) keep rope_theta beside rope_scaling."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}}))
    cfg = read_config(tmp_path)
    assert cfg.num_params() == 8_030_261_248  # Llama 3.1 8B's published count
    assert cfg.rope_scaling.factor == 8.0 and cfg.rope_theta == 500000.0


@pytest.mark.parametrize("total,n,pick,expected", [
    (8, 3, LayerPick.FIRST, (0, 1, 2)), (8, 3, LayerPick.LAST, (5, 6, 7)), (8, 3, LayerPick.SPREAD, (0, 4, 7)),
    (32, 4, LayerPick.SPREAD, (0, 10, 21, 31)), (5, 5, LayerPick.SPREAD, (0, 1, 2, 3, 4)),
    (5, 1, LayerPick.SPREAD, (0,)), (5, 1, LayerPick.LAST, (4,))])
def test_layer_picks(total, n, pick, expected):
    assert pick_layers(total, n, pick) == expected


def test_sharded_index_lists_every_tensor(tmp_path):
    one = tensor_index(save_checkpoint(hf_llama(), tmp_path / "one"))
    many = tensor_index(save_checkpoint(hf_llama(), tmp_path / "many", shard="60KB"))
    assert len({info.file for info in many.values()}) > 2  # really sharded
    assert {k: v.shape for k, v in one.items()} == {k: v.shape for k, v in many.items()}


def _raises(path: Path, *words: str, layers=(0, 1)) -> None:
    with pytest.raises(UserError) as info:
        check_checkpoint(path, layers)
    assert info.value.field == "model.init_from"
    for word in words:
        assert word in str(info.value), str(info.value)


def test_missing_tensor_is_named(tmp_path):
    model = hf_llama()
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.mlp.up_proj.weight"}
    model.save_pretrained(tmp_path, state_dict=state)
    _raises(tmp_path, "model.layers.1.mlp.up_proj.weight", "missing")
    check_checkpoint(tmp_path, (0, 2))  # a block the probe does not take may be incomplete


def test_shape_mismatch_is_named(tmp_path):
    save_checkpoint(hf_llama(), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | {"intermediate_size": 192}))
    _raises(tmp_path, "model.layers.0.mlp.gate_proj.weight", "[160, 64]", "[192, 64]")


def test_truncated_shard_is_found_from_its_header(tmp_path):
    save_checkpoint(hf_llama(), tmp_path)
    file = tmp_path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    _raises(tmp_path, "model.safetensors", "truncated")


def test_missing_shard_is_named(tmp_path):
    save_checkpoint(hf_llama(), tmp_path, shard="60KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    _raises(tmp_path, victim.name, "missing")


@pytest.mark.parametrize("change,words", [
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, ("mistral", "only Llama")),
    ({"attention_bias": True}, ("attention_bias",)),
    ({"hidden_act": "gelu"}, ("hidden_act", "silu")),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, ("yarn", "llama3")),
    ({"head_dim": 32}, ("head_dim 32",)),
])
def test_config_the_probe_cannot_run_is_refused(tmp_path, change, words):
    save_checkpoint(hf_llama(), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | change))
    _raises(tmp_path, "config.json", *words)


def test_missing_config_field_is_named(tmp_path):
    save_checkpoint(hf_llama(), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    _raises(tmp_path, "num_hidden_layers", "missing")


def test_no_directory_and_torch_dist_are_clear(tmp_path):
    _raises(tmp_path / "nowhere", "no such checkpoint directory", "nothing is downloaded")
    (tmp_path / ".metadata").write_bytes(b"\x80")
    (tmp_path / "__0_0.distcp").write_bytes(b"")
    _raises(tmp_path, "torch_dist", "not supported yet")


def test_written_config_reads_back_and_loads_in_transformers(tmp_path):
    """hf_config is read_config's inverse, and transformers builds the same model from it."""
    transformers = pytest.importorskip("transformers")
    from precsearch.arch.config import PRESETS
    from precsearch.arch.hf_checkpoint import hf_config

    cfg = PRESETS["llama3-8b"].with_overrides(max_seq_len=131072)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(cfg)))
    assert read_config(tmp_path) == cfg
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert (hf.num_key_value_heads, hf.intermediate_size, hf.vocab_size) == (8, 14336, 128256)


@pytest.mark.parametrize("header,words", [
    ([1, 2], ("a JSON list",)),
    ({"w": {"shape": [2], "data_offsets": [0, 8]}}, ("'w'", "dtype")),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, ("'w'", "data_offsets [8, 0]")),
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, ("'w'", "needs 12 bytes", "span 8")),
])
def test_malformed_safetensors_header_names_the_tensor(tmp_path, header, words):
    """A header the safetensors spec does not allow is a UserError naming the file and tensor, not a KeyError."""
    from precsearch.arch.hf_checkpoint import read_header

    raw = json.dumps(header).encode()
    file = tmp_path / "model.safetensors"
    file.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(16))
    with pytest.raises(UserError) as info:
        read_header(file)
    assert info.value.field == "model.init_from"
    for word in ("model.safetensors", *words):
        assert word in str(info.value), str(info.value)
