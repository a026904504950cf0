"""The ``te`` backend's probe is Megatron-Core's Llama 3 on TE fused modules, with the same numerics.

GPU only (H200 via the device tool). What would be wrong if these failed:
* logits far from the plain probe's or from HF ``LlamaForCausalLM``'s: a layout bug (q/k/v grouping,
  gate/up order, norm placement, RoPE format) in the TE stack;
* a unit running FP8 where the policy says BF16, or the reverse: per-unit precision is broken;
* a recipe that cannot train a few steps: the stack does not run what the search proposes.
"""

from __future__ import annotations

import pytest
import torch

from precsearch.arch.units import unit_names
from precsearch.backends import get_backend
from precsearch.backends.capability import te_import_error
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.data import TokenBatches
from precsearch.probe.model.hf_weights import to_hf
from precsearch.probe.model.llama3 import ModelConfig, build_model
from precsearch.probe.runner import build_probe, run_probe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]
CFG = ModelConfig(vocab_size=512, dim=256, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=512, max_seq_len=256)
DEV = torch.device("cuda")
#: A BF16 model against a float32 one of the same weights: BF16 rounding through 2 blocks stays above this.
BF16_MIN_SQNR_DB = 30.0
#: FP8 logits against BF16 ones: well below BF16's agreement, far above noise.
FP8_MIN_SQNR_DB = 15.0


@pytest.fixture(autouse=True)
def _need_te():
    if (error := te_import_error()) is not None:
        pytest.skip(error)


def sqnr_db(reference: torch.Tensor, x: torch.Tensor) -> float:
    ref = reference.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (x.double() - ref).pow(2).sum()))


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (2, 128), generator=torch.Generator().manual_seed(seed)).to(DEV)


def _te_model(policy: Policy) -> torch.nn.Module:
    return build_probe(CFG, policy, get_backend("te", DEV), DEV, seed=0, param_dtype="bf16")


def _logits(model: torch.nn.Module, fp8: bool) -> torch.Tensor:
    backend = get_backend("te", DEV)
    with torch.no_grad(), backend.autocast(model, enabled=fp8), torch.autocast("cuda", dtype=torch.bfloat16):
        return model(_ids()).float()


def test_bf16_te_stack_matches_the_plain_probe_and_hugging_face():
    plain = build_model(CFG, 0, DEV).eval()  # float32: the exact reference
    with torch.no_grad():
        exact = plain(_ids()).float()
    te_model = _te_model(Policy()).eval()
    db = sqnr_db(exact, _logits(te_model, fp8=False))
    print(f"TE BF16 stack vs float32 probe: {db:.1f} dB")
    assert db > BF16_MIN_SQNR_DB
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=CFG.vocab_size, hidden_size=CFG.dim, intermediate_size=CFG.ffn_dim,
        num_hidden_layers=CFG.n_layers, num_attention_heads=CFG.n_heads, num_key_value_heads=CFG.n_kv_heads,
        max_position_embeddings=CFG.max_seq_len, rms_norm_eps=CFG.norm_eps, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": CFG.rope_theta})
    hf = transformers.LlamaForCausalLM(hf_cfg).to(DEV).eval()
    hf.load_state_dict(to_hf(CFG, plain.state_dict()), strict=True)
    with torch.no_grad():
        hf_logits = hf(input_ids=_ids()).logits.float()
    assert sqnr_db(exact, hf_logits) > 60  # float32 both: the layouts are the same model
    assert sqnr_db(hf_logits, _logits(te_model, fp8=False)) > BF16_MIN_SQNR_DB


def test_fp8_runs_only_in_the_units_the_policy_names():
    policy = Policy(rules=(Rule("attention", ("*.self_attention.*",), Precision.FP8_CURRENT),))
    model = _te_model(policy)
    db = sqnr_db(_logits(model, fp8=False), _logits(model, fp8=True))
    ran = {u: bool(m.linear.fp8) for m in model.modules() if hasattr(m, "units") for u in m.units}
    print(f"FP8 attention vs BF16 logits: {db:.1f} dB; fp8 ran: {ran}")
    assert FP8_MIN_SQNR_DB < db < 60
    for name in unit_names(CFG):
        assert ran.get(name, False) == ("self_attention" in name), name
    assert get_backend("te", DEV).converted_layers(model) == {
        n: Precision.FP8_CURRENT for n in unit_names(CFG) if "self_attention" in n}


def test_mlp_is_one_layernorm_mlp_when_fc1_and_fc2_share_a_recipe():
    import transformer_engine.pytorch as te

    same = _te_model(Policy(default=Precision.FP8_DELAYED))
    assert isinstance(same.decoder.layers[0].mlp.layernorm_mlp.linear, te.LayerNormMLP)
    assert isinstance(same.decoder.layers[0].self_attention.linear_qkv.linear, te.LayerNormLinear)
    split = _te_model(Policy(rules=(Rule("fc1", ("*.linear_fc1",), Precision.FP8_CURRENT),)))
    mlp = split.decoder.layers[0].mlp
    assert isinstance(mlp.linear_fc1.linear, te.LayerNormLinear) and isinstance(mlp.linear_fc2.linear, te.Linear)


@pytest.mark.parametrize("policy", [
    Policy(default=Precision.FP8_DELAYED, recipe=LayerRecipe(amax_history_len=16)),
    Policy(default=Precision.FP8_CURRENT),
    Policy(default=Precision.FP8_BLOCK),
    Policy(rules=(Rule("attention", ("*.self_attn.*",), Precision.FP8_CURRENT),
                  Rule("mlp", ("*.mlp.*",), Precision.FP8_DELAYED)), warmup_steps=2),
], ids=["delayed", "current", "block", "attn_current_mlp_delayed_warmup"])
def test_every_hopper_recipe_trains(policy: Policy):
    probe = ProbeSection(steps=12, micro_batch=4, seq_len=128, lr=3e-3, lr_warmup_steps=2, device="cuda",
                         param_dtype="bf16")
    tokens = torch.randint(0, 64, (40_000,), generator=torch.Generator().manual_seed(0))  # 64 of 512 ids used
    data = TokenBatches(tokens, seq_len=128, micro_batch=4, seed=0, eval_batches=1)
    result = run_probe(CFG, probe, policy, data, get_backend("te", DEV), DEV)
    print(f"losses {result.losses[0]:.3f} -> {result.losses[-1]:.3f}, eval {result.eval_loss:.3f}")
    assert not result.diverged, result.reason
    assert result.losses[-1] < result.losses[0] - 0.5  # 64 of 512 tokens: the unigram is learnt quickly
    assert result.layer_stats, "FP8 statistics were collected"


@pytest.mark.parametrize("precision", [Precision.FP8_DELAYED, Precision.FP8_CURRENT], ids=["delayed", "current"])
def test_a_rung_continues_on_the_te_stack(tmp_path, precision):
    """6 steps saved and continued to 14 track 14 straight steps on TE. Delayed scaling is the case that
    broke: TE 2.20 refuses to unpickle its FP8 metadata from a state dict without an opt-in, so every
    promoted delayed-scaling rung failed (bench_fidelity on the H200, 2026-11-30)."""
    from precsearch.probe.continuation import Leg

    policy = Policy(default=precision, recipe=LayerRecipe(amax_history_len=16), clip_grad=1.0)
    tokens = torch.randint(0, 64, (40_000,), generator=torch.Generator().manual_seed(0))

    def run(steps: int, leg: Leg):
        probe = ProbeSection(steps=steps, micro_batch=4, seq_len=128, lr=3e-3, lr_warmup_steps=2, device="cuda",
                             param_dtype="bf16")
        data = TokenBatches(tokens, seq_len=128, micro_batch=4, seed=0, eval_batches=1)
        return run_probe(CFG, probe, policy, data, get_backend("te", DEV), DEV, leg=leg)

    straight = run(14, Leg(horizon=14))
    ckpt = str(tmp_path / "rung0.pt")
    run(6, Leg(horizon=14, save_to=ckpt))
    continued = run(14, Leg(horizon=14, resume_from=ckpt))
    print(f"straight {straight.losses[-1]:.4f} continued {continued.losses[-1]:.4f}")
    assert continued.start_step == 6 and not continued.diverged, continued.reason
    # GPU kernels (attention backward) are not bit-deterministic: close, not equal
    torch.testing.assert_close(torch.tensor(continued.losses), torch.tensor(straight.losses), rtol=2e-3, atol=0)
