"""Tests for the Llama 3 probe model: HF equivalence, naming, training, presets."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from precsearch.arch.units import unit_names
from precsearch.probe.model.hf_weights import from_hf, to_hf
from precsearch.probe.model.llama3 import (
    PRESETS,
    Llama3,
    ModelConfig,
    RopeScaling,
    build_model,
    init_weights,
    rope_inv_freq,
)

# head_dim 16 -> 8 RoPE frequencies. With original_max_position_embeddings=64 the
# wavelength thresholds are 16 and 64, so with theta 10000 one frequency is kept, one
# is blended and the rest are stretched: the scaling visibly matters at seq 64.
SMALL = ModelConfig(
    vocab_size=256,
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    ffn_dim=128,
    norm_eps=1e-5,
    rope_theta=10000.0,
    rope_scaling=RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    ),
    max_seq_len=256,
)


def _hf_model(cfg: ModelConfig):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters=cfg.rope_scaling.to_hf(cfg.rope_theta),
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(hf_cfg).float().eval()


def test_rope_scaling_changes_some_frequencies():
    scaled = rope_inv_freq(SMALL)
    plain = rope_inv_freq(SMALL.with_overrides(rope_scaling=None))
    assert torch.equal(scaled[0], plain[0])  # short wavelength kept
    assert torch.allclose(scaled[-1], plain[-1] / 8)  # long wavelength stretched
    assert ((scaled != plain) & (scaled != plain / 8)).any()  # blended band


def _perturbed(cfg: ModelConfig, seed: int) -> Llama3:
    """A probe whose norm weights are not all ones, so a misplaced norm weight changes the logits."""
    model = build_model(cfg, seed=seed).eval()
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("layer_norm_weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
    return model


def test_logits_match_hugging_face():
    """Same weights (converted to HF's layout) give the same logits: the fused q/k/v grouping, the
    gate/up order and where each norm weight sits are all right. A failure names a layout bug."""
    ours = _perturbed(SMALL, 0)
    hf = _hf_model(SMALL)
    hf.load_state_dict(to_hf(SMALL, ours.state_dict()), strict=True)
    torch.testing.assert_close(hf.model.rotary_emb.inv_freq, ours.rotary_pos_emb.inv_freq)
    ids = torch.randint(0, SMALL.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        actual = ours(ids)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_loss_matches_hugging_face():
    ours = _perturbed(SMALL, 3)
    hf = _hf_model(SMALL)
    hf.load_state_dict(to_hf(SMALL, ours.state_dict()), strict=True)
    ids = torch.randint(0, SMALL.vocab_size, (2, 33), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        # HF shifts labels internally; ours takes targets already shifted.
        expected = hf(input_ids=ids, labels=ids).loss
        actual = ours(ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_hugging_face_weights_round_trip_exactly():
    """HF -> probe -> HF is the identity, tensor by tensor (the conversion is a permutation)."""
    hf = _hf_model(SMALL)
    state = hf.state_dict()
    back = to_hf(SMALL, from_hf(SMALL, state))
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_missing_hugging_face_tensor_is_named():
    state = _hf_model(SMALL).state_dict()
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        from_hf(SMALL, state)


def test_module_names_are_megatron_cores():
    """The units and parameters carry Megatron-Core's GPT names (TE spec), so a policy names the
    modules users train with."""
    names = dict(Llama3(SMALL).named_parameters())
    for expected in ("embedding.word_embeddings.weight", "decoder.layers.1.self_attention.linear_qkv.weight",
                     "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight",
                     "decoder.layers.1.self_attention.linear_proj.weight", "decoder.layers.1.mlp.linear_fc1.weight",
                     "decoder.layers.1.mlp.linear_fc1.layer_norm_weight", "decoder.layers.1.mlp.linear_fc2.weight",
                     "decoder.final_layernorm.weight", "output_layer.weight"):
        assert expected in names
    assert len(names) == 3 + SMALL.n_layers * 6


def test_unit_names_match_built_model():
    model = Llama3(SMALL)
    built = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert unit_names(SMALL) == built
    assert len(built) == 4 * SMALL.n_layers + 1
    for name in built:
        assert model.get_submodule(name).bias is None


def test_projections_can_be_swapped_by_name():
    class Counting(nn.Module):
        def __init__(self, inner: nn.Linear):
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.inner(x)

    model = build_model(SMALL, seed=0)
    ids = torch.randint(0, SMALL.vocab_size, (1, 8))
    before = model(ids)
    wrappers = {}
    for name in unit_names(SMALL):
        wrappers[name] = Counting(model.get_submodule(name))
        model.set_submodule(name, wrappers[name])
    torch.testing.assert_close(model(ids), before)
    assert all(w.calls == 1 for w in wrappers.values())


def test_init_is_deterministic_per_seed():
    a, b, c = (build_model(SMALL, seed=s) for s in (7, 7, 8))
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if name.endswith(("norm.weight", "layer_norm_weight")):
            assert torch.equal(pa, torch.ones_like(pa))
        else:
            assert not torch.equal(pa, pc), name
            assert abs(pa.std().item() - 0.02) < 0.005, name


def test_init_weights_resets_a_model():
    model = build_model(SMALL, seed=5)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    init_weights(model, 5)
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference[name]), name


def _pattern_batch(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    pattern = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    stream = pattern.repeat(10)[:33]
    return stream[:-1].unsqueeze(0).repeat(2, 1), stream[1:].unsqueeze(0).repeat(2, 1)


def test_loss_decreases_on_repeating_pattern():
    torch.manual_seed(0)
    model = build_model(SMALL, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs, targets = _pattern_batch(SMALL)
    losses = []
    for _ in range(20):
        loss = model(inputs, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(SMALL.vocab_size), rel=0.1)
    assert losses[-1] < 0.5 * losses[0]


def test_backward_under_bf16_autocast():
    model = build_model(SMALL, seed=0)
    inputs, targets = _pattern_batch(SMALL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(inputs)
        loss = model(inputs, targets)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_bf16_weights_forward():
    model = build_model(SMALL, seed=0).to(torch.bfloat16)
    inputs, targets = _pattern_batch(SMALL)
    loss = model(inputs, targets)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_sequence_longer_than_max_is_refused():
    model = Llama3(SMALL.with_overrides(max_seq_len=16))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_presets_validate_and_have_published_sizes():
    assert set(PRESETS) == {"llama3-8b", "llama3-70b", "llama3.2-1b", "llama3.2-3b", "tiny"}
    assert PRESETS["llama3-8b"].num_params() == pytest.approx(8.03e9, rel=0.002)
    assert PRESETS["llama3-70b"].num_params() == pytest.approx(70.55e9, rel=0.002)
    # The 3.2 models tie their head on the Hub; ours is untied, so add one embedding.
    for name, tied in (("llama3.2-1b", 1.236e9), ("llama3.2-3b", 3.213e9)):
        cfg = PRESETS[name]
        assert cfg.num_params() - cfg.vocab_size * cfg.dim == pytest.approx(tied, rel=0.002)
    for cfg in PRESETS.values():
        assert cfg.with_overrides() == cfg  # re-validates
    assert PRESETS["llama3-8b"].head_dim == 128
    assert PRESETS["tiny"].vocab_size == 256


@pytest.mark.parametrize("name", ["tiny"])
def test_num_params_is_exact(name: str):
    cfg = PRESETS[name]
    assert cfg.num_params() == sum(p.numel() for p in Llama3(cfg).parameters())
    assert SMALL.num_params() == sum(p.numel() for p in Llama3(SMALL).parameters())


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"dim": 100}, "model.dim"),
        ({"n_kv_heads": 3}, "model.n_kv_heads"),
        ({"n_layers": 0}, "model.n_layers"),
        ({"vocab_size": -1}, "model.vocab_size"),
        ({"ffn_dim": 0}, "model.ffn_dim"),
        ({"norm_eps": 0.0}, "model.norm_eps"),
        ({"n_heads": 32, "n_kv_heads": 8, "dim": 96}, "must be even"),
        ({"unknown": 1}, "model.unknown"),
    ],
)
def test_invalid_config_names_the_field(overrides: dict, field: str):
    with pytest.raises(ValueError, match=field):
        SMALL.with_overrides(**overrides)


def test_rope_scaling_validation_and_mapping():
    with pytest.raises(ValueError, match="high_freq_factor"):
        RopeScaling(factor=8, low_freq_factor=4, high_freq_factor=1, original_max_position_embeddings=8192)
    with pytest.raises(ValueError, match="rope_scaling.factor"):
        RopeScaling(factor=0, low_freq_factor=1, high_freq_factor=4, original_max_position_embeddings=8192)
    as_dict = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert SMALL.with_overrides(rope_scaling=as_dict) == SMALL
