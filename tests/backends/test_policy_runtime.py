"""The Python API: load a policy file, apply it to the probe and to HF LlamaForCausalLM, train under it.

Tolerances. Our probe and run_probe run the same ops in the same order, so their
loss curves are compared for equality (atol 1e-6). The probe and HF
``LlamaForCausalLM`` differ only by op-order rounding (HF rotates q/k in float32
after the bf16 projection, we in bf16; HF repeats k/v before SDPA); emulated FP8
then turns a few of those last-bit differences into different FP8 codes. Over 8
steps the curves agree within 5e-3 relative (measured: <= 1e-3), and the first
loss, before any update and during the BF16 warm-up, within 1e-4.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import precsearch
from precsearch.backends.emulated import EmulatedBackend, EmulatedFP8Linear
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, PolicyError, PolicyRuntime, Rule, load_policy
from precsearch.policy.file import save_policy
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.arch.units import hf_names, unit_names
from precsearch.probe.model.hf_weights import to_hf
from precsearch.probe.model.llama3 import ModelConfig, build_model
from precsearch.probe.runner import run_probe

P = Precision
CFG = ModelConfig(vocab_size=256, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=128,
                  max_seq_len=64, rope_theta=10000.0)
STEPS, LR, BETAS, WD = 8, 3e-3, (0.9, 0.95), 0.1
POLICY = Policy(
    rules=(
        Rule("first_block", ("*",), P.BF16, first=1),
        Rule("attention", ("*.self_attn.*",), P.FP8_CURRENT),
        Rule("mlp", ("*.mlp.*",), P.FP8_DELAYED),
    ),
    default=P.BF16,
    recipe=LayerRecipe(amax_history_len=16),
    warmup_steps=3,
    clip_grad=1.0,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny GEMMs: a second thread only adds contention (8x slower on a 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "policy.yaml"
    save_policy(POLICY, path, {"study": "unit", "trial": 7})
    return path


@pytest.fixture(scope="module")
def data():
    return TokenBatches(synthetic_tokens(20_000, CFG.vocab_size, 0), seq_len=32, micro_batch=4, seed=0,
                        eval_batches=1)


def _hf_model():
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=CFG.vocab_size, hidden_size=CFG.dim, intermediate_size=CFG.ffn_dim,
        num_hidden_layers=CFG.n_layers, num_attention_heads=CFG.n_heads, num_key_value_heads=CFG.n_kv_heads,
        max_position_embeddings=CFG.max_seq_len, rms_norm_eps=CFG.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": CFG.rope_theta},
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(hf_cfg).float()


def _expected_precisions() -> dict[str, Precision]:
    return {n: p for n in unit_names(CFG) if (p := POLICY.precision_for(n, CFG.n_layers)).is_fp8}


def _train(policy: PolicyRuntime, model: nn.Module, data: TokenBatches, hf: bool) -> list[float]:
    """The loop run_probe runs (AdamW, constant LR), written with the public API."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WD)
    losses = []
    for step in range(STEPS):
        inputs, targets = data.train_batch(step)
        with policy.autocast(model, step):
            if hf:
                logits = model(input_ids=inputs).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            else:
                loss = model(inputs, targets)
        loss.backward()
        policy.clip_gradients(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def test_load_policy_returns_a_runtime_that_reads_like_the_policy(policy_file):
    policy = precsearch.policy.load_policy(policy_file)
    assert isinstance(policy, PolicyRuntime)
    assert policy.policy == POLICY and policy.to_dict() == POLICY.to_dict()
    assert policy.warmup_steps == 3 and policy.clip_grad == 1.0 and policy.uses_fp8
    assert policy.provenance == {"study": "unit", "trial": 7}
    assert [policy.fp8_enabled(s) for s in range(5)] == [False, False, False, True, True]


def test_round_trip_probe_hf_and_run_probe_agree(policy_file, data):
    policy = load_policy(policy_file)
    ours = build_model(CFG, seed=0)
    hf = _hf_model()
    hf.load_state_dict(to_hf(CFG, ours.state_dict()), strict=True)

    assert policy.apply(ours) is ours and policy.apply(hf) is hf
    backend = EmulatedBackend()
    expected = _expected_precisions()
    assert backend.converted_layers(ours) == expected
    # the HF model gets every projection of a fused unit at the unit's precision
    assert backend.converted_layers(hf) == {a: p for unit, p in expected.items() for a in hf_names(unit)}
    assert "decoder.layers.0.self_attention.linear_qkv" not in expected and "output_layer" not in expected
    assert expected["decoder.layers.2.mlp.linear_fc1"] is P.FP8_DELAYED

    ours_losses = _train(policy, ours, data, hf=False)
    hf_losses = _train(policy, hf, data, hf=True)
    assert hf_losses[0] == pytest.approx(ours_losses[0], rel=1e-4)
    # per-tensor FP8 scales: one for the fused q/k/v (gate/up) weight here, one per projection in HF
    assert hf_losses == pytest.approx(ours_losses, rel=5e-3)
    assert ours_losses[-1] < ours_losses[0]  # it trains

    probe = ProbeSection(steps=STEPS, micro_batch=4, seq_len=32, lr=LR, schedule="constant", lr_warmup_steps=0,
                         weight_decay=WD, betas=BETAS, seed=0, device="cpu")
    result = run_probe(CFG, probe, POLICY, data, backend, torch.device("cpu"))
    assert result.fp8_steps == [False] * 3 + [True] * (STEPS - 3)
    assert result.losses == pytest.approx(ours_losses, abs=1e-6)


def test_autocast_turns_fp8_off_during_the_warmup():
    policy = PolicyRuntime(POLICY)
    model = policy.apply(build_model(CFG, seed=0))
    layers = [m for m in model.modules() if isinstance(m, EmulatedFP8Linear)]
    seen = []
    for step in (0, 2, 3, 10):
        with policy.autocast(model, step):
            seen.append({m.fp8_enabled for m in layers})
            assert torch.is_autocast_enabled("cpu")
        with policy.autocast(model, step, bf16=False):
            assert not torch.is_autocast_enabled("cpu")
    assert seen == [{False}, {False}, {True}, {True}]


def test_autocast_finds_the_backend_through_a_wrapper():
    policy = PolicyRuntime(POLICY)
    inner = policy.apply(build_model(CFG, seed=0))
    wrapper = nn.ModuleDict({"module": inner})  # what DDP / FSDP / accelerate put around it
    with policy.autocast(wrapper, 0):
        assert not any(m.fp8_enabled for m in inner.modules() if isinstance(m, EmulatedFP8Linear))


def test_autocast_before_apply_is_refused():
    with pytest.raises(PolicyError, match="apply"):
        with PolicyRuntime(POLICY).autocast(build_model(CFG, seed=0), 5):
            pass


def test_bf16_policy_needs_no_apply_for_autocast():
    """A BF16 policy runs an unconverted model under its autocast (BF16 compute), without PolicyError."""
    model = build_model(CFG, seed=0)
    with PolicyRuntime(Policy.bf16()).autocast(model, 0):
        logits = model(torch.zeros(1, 8, dtype=torch.long))
    assert logits.dtype == torch.bfloat16


def test_clip_gradients_clips_to_the_policy_and_returns_the_norm():
    layer = nn.Linear(4, 4, bias=False)
    layer.weight.grad = torch.full((4, 4), 3.0)  # norm 12
    norm = PolicyRuntime(POLICY).clip_gradients(layer)
    assert float(norm) == pytest.approx(12.0)
    assert float(layer.weight.grad.norm()) == pytest.approx(1.0, rel=1e-5)
    layer.weight.grad = torch.full((4, 4), 3.0)
    norm = PolicyRuntime(Policy(clip_grad=None)).clip_gradients(layer)
    assert float(norm) == pytest.approx(12.0)
    assert torch.equal(layer.weight.grad, torch.full((4, 4), 3.0))  # untouched


class _OtherNames(nn.Module):
    """A model whose blocks are ``blocks.N.attn.wq`` / ``blocks.N.ffn.w2``."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"attn": nn.ModuleDict({"wq": nn.Linear(8, 8)}),
                           "ffn": nn.ModuleDict({"w2": nn.Linear(8, 8)})}) for _ in range(3))


def _to_hf(name: str) -> str | None:
    _, block, part, proj = name.split(".")
    return {"attn.wq": f"model.layers.{block}.self_attn.q_proj",
            "ffn.w2": f"model.layers.{block}.mlp.down_proj"}.get(f"{part}.{proj}")


def test_other_names_are_refused_clearly_and_work_with_a_name_map():
    policy = PolicyRuntime(POLICY)
    with pytest.raises(PolicyError, match=r"no rule .* matches .*blocks\.0\.attn\.wq.*name_map"):
        policy.apply(_OtherNames())
    model = policy.apply(_OtherNames(), name_map=_to_hf)
    assert EmulatedBackend().converted_layers(model) == {
        "blocks.1.attn.wq": P.FP8_CURRENT, "blocks.2.attn.wq": P.FP8_CURRENT,
        "blocks.1.ffn.w2": P.FP8_DELAYED, "blocks.2.ffn.w2": P.FP8_DELAYED}


def test_name_map_none_skips_a_layer_and_n_layers_drives_last_k_rules():
    policy = PolicyRuntime(Policy(rules=(Rule("tail", ("*",), P.BF16, last=1),), default=P.FP8_CURRENT))
    model = _OtherNames()
    plan = policy.precisions(model, name_map=lambda n: _to_hf(n) if ".attn." in n else None)
    assert plan == {"blocks.0.attn.wq": P.FP8_CURRENT, "blocks.1.attn.wq": P.FP8_CURRENT,
                    "blocks.2.attn.wq": P.BF16}  # 3 blocks inferred: block 2 is the last
    with pytest.warns(UserWarning, match=r"rules\[0\] \('tail'\) decides no layer"):  # a part of a deeper model
        plan = policy.precisions(model, name_map=_to_hf, n_layers=10)
    assert set(plan.values()) == {P.FP8_CURRENT}  # in a 10-block model these are not the last block


def test_a_backend_instance_or_name_is_accepted_and_unknown_names_are_refused():
    from precsearch.backends import BackendUnavailable

    policy = PolicyRuntime(POLICY)
    policy.apply(build_model(CFG, seed=0), backend=EmulatedBackend())
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        policy.apply(build_model(CFG, seed=0), backend="nope")
