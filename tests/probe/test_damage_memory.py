"""The reading's memory savings change none of its figures (issue 55: the reading's peak memory).

The BF16 side keeps its gradients in BF16 where that is exact (:func:`reading.kept_grad`), a gradient is taken
from its weight instead of copied, and the BF16 run's last state is its own tensors instead of a copy: each is
checked here against the code path it replaced, on a tiny probe (CPU), to the bit.
"""

from __future__ import annotations

import pytest
import torch
from _floats import same_values

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.damage import DamageReader, reading as reading_mod
from precsearch.probe.damage.states import reference_states
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
PROBE = ProbeSection(steps=6, micro_batch=2, seq_len=32, lr=3e-3, lr_warmup_steps=1, device="cpu")
SETTINGS = DamageSection(states=[0.5, 1.0], batches=3, tokens_per_step=4096)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(synthetic_tokens(20_000, CFG.vocab_size, seed=0), seq_len=32, micro_batch=2, seed=0,
                        eval_batches=1)


def test_kept_grad_narrows_only_exact_values():
    bf16_values = torch.randn(1000).to(torch.bfloat16).float()
    assert reading_mod.kept_grad(bf16_values).dtype == torch.bfloat16
    assert torch.equal(reading_mod.kept_grad(bf16_values).float(), bf16_values)
    inexact = bf16_values + 1e-5
    assert reading_mod.kept_grad(inexact) is inexact
    with_nan = bf16_values.clone()
    with_nan[3] = float("nan")
    assert reading_mod.kept_grad(with_nan).dtype == torch.float32  # NaN kept where it is, in float32
    with_inf = bf16_values.clone()
    with_inf[5] = float("inf")
    assert torch.equal(reading_mod.kept_grad(with_inf).float(), with_inf)  # infinities are exact in BF16
    halves = torch.ones(4, dtype=torch.bfloat16)
    assert reading_mod.kept_grad(halves) is halves


def test_a_gradient_is_taken_from_its_weight_and_copied_only_when_it_is_a_view():
    weight = torch.nn.Parameter(torch.zeros(3, 4))
    weight.grad = torch.randn(3, 4) + 1e-3  # not exact in BF16: kept as it is
    ptr = weight.grad.data_ptr()
    taken = reading_mod._take_grad(weight)
    assert weight.grad is None and taken.data_ptr() == ptr
    buffer = torch.randn(24) + 1e-3
    weight.grad = buffer[12:].view(3, 4)  # a view into a buffer a backend may reuse
    taken = reading_mod._take_grad(weight)
    assert taken.data_ptr() != buffer[12:].data_ptr() and torch.equal(taken, buffer[12:].view(3, 4))


def test_the_bf16_sides_gradients_are_kept_in_bf16_with_fp32_parameters(data):
    reader = DamageReader(CFG, PROBE, data, EmulatedBackend(), CPU, SETTINGS)
    for _, side in reader.bf16_sides(None):
        assert {t.dtype for batch in side.grads for t in batch.values()} == {torch.bfloat16}


POLICIES = {
    "fp8_current": Policy(rules=(Rule("fp8", ("*",), Precision.FP8_CURRENT),)),
    "fp8_delayed, blocks": Policy(rules=(Rule("fp8", ("decoder.layers.*",), Precision.FP8_DELAYED),)),
    "fp8 moments, fp16 master": Policy.bf16(None, MemoryKnobs(moment_dtype="fp8", master_weights=True, master_dtype="fp16")),
}


def _copying(weight: torch.Tensor) -> torch.Tensor:
    """The gradient as the reading took it before: an FP32 copy, the weight's gradient left in place."""
    return weight.grad.detach().clone()


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_reading_is_the_one_with_float32_copies_of_every_gradient(data, monkeypatch, name):
    """Every figure, per state and unit, value and standard error, equal to the bit to a reading whose sides copy
    each gradient in float32 (the code before the BF16 storage)."""
    new = DamageReader(CFG, PROBE, data, EmulatedBackend(), CPU, SETTINGS).read(POLICIES[name])
    monkeypatch.setattr(reading_mod, "_take_grad", _copying)
    old = DamageReader(CFG, PROBE, data, EmulatedBackend(), CPU, SETTINGS).read(POLICIES[name])
    assert new["value"] == old["value"] and new["se"] == old["se"]
    assert same_values(new["states"], old["states"])


def test_the_last_state_taken_from_the_run_equals_a_copy(data):
    """The run's last state is its own tensors (no copy); the same state read as a middle one (copied) is equal."""
    last = reference_states(CFG, PROBE, data, CPU, None, [2, 4])[1]
    middle = reference_states(CFG, PROBE, data, CPU, None, [2, 4, 5])[1]
    assert last.step == middle.step == 4 and last.lr == middle.lr
    assert last.weights.keys() == middle.weights.keys() and last.moments.keys() == middle.moments.keys()
    for key, t in last.weights.items():
        assert t.dtype == torch.float32 and not t.requires_grad and torch.equal(t, middle.weights[key])
    for unit, (a, b) in last.moments.items():
        assert torch.equal(a, middle.moments[unit][0]) and torch.equal(b, middle.moments[unit][1])
