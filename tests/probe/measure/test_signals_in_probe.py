"""The early-warning signals are recorded by the probe itself, for the policy and its BF16 reference.

If these fail, a trial's MLflow run would show no signals, or signals read from the wrong tensors
(an alignment that is not the gate/up rows of linear_fc1, a logit not from q and k after RoPE).
"""

from __future__ import annotations

import math

import pytest
import torch

from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.precision import Precision
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig, build_model
from precsearch.probe.runner import run_probe
from precsearch.probe.measure.signal_recorder import SignalRecorder
from precsearch.probe.measure.signals import Signals, gate_up_alignment

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(synthetic_tokens(20_000, CFG.vocab_size, 0), seq_len=32, micro_batch=4, seed=0,
                        eval_batches=1)


@pytest.mark.parametrize("policy", [Policy(), Policy(default=Precision.FP8_DELAYED)], ids=["bf16", "fp8"])
def test_probe_records_every_signal_on_stat_steps(data, policy):
    probe = ProbeSection(steps=31, micro_batch=4, seq_len=32, lr=3e-3, device="cpu")
    result = run_probe(CFG, probe, policy, data, get_backend("emulated", CPU), CPU)
    signals = Signals.from_dict(result.signals)
    assert [s for s, _ in signals.series["kurtosis"]] == [0, 10, 20, 30]  # stat steps: every 10 and the last
    assert signals.kurtosis > 1 and 0 < signals.alignment < signals.alignment_max <= 1
    assert signals.attention_logit > 0 and math.isfinite(signals.grad_norm_trend)
    assert len(signals.series["grad_norm"]) == 31  # every step
    assert math.isfinite(signals.amax_growth) and signals.amax_growth_at.startswith("block.")
    if policy.uses_fp8:  # FP8 operand amaxes come in from the diagnostics' rows, kept apart
        assert ":" in signals.fp8_amax_growth_at and math.isfinite(signals.fp8_amax_growth)
    else:
        assert math.isnan(signals.fp8_amax_growth)


def test_recorder_reads_the_fused_gate_up_rows_and_the_rotated_queries():
    """Alignment from linear_fc1's own weight; the max logit from q and k after RoPE (brute force)."""
    model = build_model(CFG, 0)
    rec = SignalRecorder(steps=1)
    detach = rec.attach(model)
    rec.begin_step(0)
    rec.record_fc1_weights(model)
    seen = {}
    attention = model.decoder.layers[1].self_attention
    original = attention.observe_qk
    attention.observe_qk = lambda q, k: (seen.update(q=q.detach(), k=k.detach()), original(q, k))
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    model(ids, ids)
    rec.end_step()
    detach()
    assert model.decoder.layers[0].self_attention.observe_qk is None  # detached
    mean, _ = gate_up_alignment(model.decoder.layers[1].mlp.linear_fc1.weight)
    assert rec.history["alignment"]["1"][0] == pytest.approx(float(mean))
    q, k = seen["q"].transpose(1, 2).double(), seen["k"].transpose(1, 2).double()
    k = k.repeat_interleave(CFG.n_heads // CFG.n_kv_heads, dim=1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(CFG.head_dim)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    expected = logits[:1].masked_fill(~causal, -math.inf).max()  # attention_batch=1: the first sequence
    assert rec.history["attention_logit"]["1"][0] == pytest.approx(float(expected), rel=1e-5)
