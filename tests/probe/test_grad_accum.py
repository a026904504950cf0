"""Gradient accumulation (``probe.grad_accum``): more tokens per optimizer step, same activation peak.

If these fail, a probe with ``grad_accum`` above 1 would train on repeated or overlapping windows, step the
optimizer per micro-batch instead of per step, or report throughput and memory for one micro-batch; or a
probe with ``grad_accum: 1`` would no longer repeat the runs (and cached references) made before it existed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.loader import parse_space
from precsearch.config.space import ProbeSection, Space
from precsearch.errors import UserError
from precsearch.policy import Policy
from precsearch.precision import Precision
from precsearch.probe import runner
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.model.llama3 import PRESETS, ModelConfig
from precsearch.runtime.reference import reference_key

CFG = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
CPU = torch.device("cpu")
TOKENS = synthetic_tokens(20_000, CFG.vocab_size, 0)


def _data(micro_batch: int, grad_accum: int = 1, seed: int = 0) -> TokenBatches:
    return TokenBatches(TOKENS, seq_len=16, micro_batch=micro_batch, seed=seed, eval_batches=1, grad_accum=grad_accum)


def test_grad_accum_one_draws_the_windows_drawn_before_accumulation_existed():
    """The pre-accumulation draw, written out: a change here would move every cached reference's data."""
    data = _data(micro_batch=4)
    for step in (0, 7):
        mixed = int(np.random.SeedSequence([0, step]).generate_state(1, dtype=np.uint64)[0])
        old = torch.randint(0, data.max_offset + 1, (4,), generator=torch.Generator().manual_seed(mixed))
        assert torch.equal(data.train_offsets(step), old)
        assert torch.equal(data.train_batch(step)[0], data._windows(old)[0])


def test_micro_batches_are_distinct_deterministic_and_together_the_wide_batch():
    accumulated, wide = _data(micro_batch=2, grad_accum=3), _data(micro_batch=6)
    again = _data(micro_batch=2, grad_accum=3)
    micros = [accumulated.train_batch(5, k)[0] for k in range(3)]
    assert all(torch.equal(m, again.train_batch(5, k)[0]) for k, m in enumerate(micros))  # deterministic
    assert not torch.equal(micros[0], micros[1]) and not torch.equal(micros[1], micros[2])  # distinct
    assert torch.equal(torch.cat(micros), wide.train_batch(5)[0])  # the step's windows, cut in order
    assert not torch.equal(accumulated.train_batch(6, 0)[0], micros[0])  # another step, other windows
    with pytest.raises(ValueError, match="micro must lie"):
        accumulated.train_batch(5, 3)


def _old_train_step(model, opt, data, step, clip):
    """The probe step as it was before accumulation (7e7c4bd), for the bit-identity check."""
    inputs, targets = data.train_batch(step)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(inputs, targets)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach()), float(grad_norm)


def _trained(step_fn, steps: int = 4):
    backend = EmulatedBackend()
    model = runner.build_probe(CFG, Policy.bf16(1.0), backend, CPU, seed=0)
    opt = backend.build_optimizer(model, Policy().memory, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    records = [step_fn(model, opt, step) for step in range(steps)]
    return records, [p.detach().clone() for p in model.parameters()]


def test_grad_accum_one_trains_bit_identically_to_the_step_before_it():
    data, backend = _data(micro_batch=4), EmulatedBackend()
    new, new_w = _trained(lambda m, o, s: runner._train_step(m, o, data, s, False, 1.0, backend, CPU, accum=1))
    old, old_w = _trained(lambda m, o, s: _old_train_step(m, o, data, s, 1.0))
    assert new == old  # losses and gradient norms, exactly
    assert all(torch.equal(a, b) for a, b in zip(new_w, old_w))


def test_accumulated_steps_match_one_wide_batch_and_step_once_per_step():
    """Two micro-batches of 2 average to the gradient of the batch of 4 they cut: the same run within
    BF16 rounding. Summing instead of averaging would double the (unclipped) gradient norm; stepping the
    optimizer per micro-batch would take twice the steps and move the later losses."""
    backend = EmulatedBackend()
    acc_data, wide_data = _data(micro_batch=2, grad_accum=2), _data(micro_batch=4)
    acc, _ = _trained(lambda m, o, s: runner._train_step(m, o, acc_data, s, False, None, backend, CPU, accum=2))
    wide, _ = _trained(lambda m, o, s: runner._train_step(m, o, wide_data, s, False, None, backend, CPU))
    assert [loss for loss, _ in acc] == pytest.approx([loss for loss, _ in wide], rel=1e-3)
    assert [norm for _, norm in acc] == pytest.approx([norm for _, norm in wide], rel=2e-2)


def test_throughput_counts_every_micro_batch():
    probe = ProbeSection(steps=4, micro_batch=2, seq_len=16, grad_accum=3, device="cpu")
    result = runner.ProbeResult()
    runner._measure(result, CFG, probe, Policy(), None, CPU, [2.0, 2.0, 2.0], 0.0)
    assert result.tokens_per_s == 2 * 16 * 3 / 2.0  # not one micro-batch's 2 x 16 tokens


def test_probe_trains_with_accumulation_and_refuses_data_cut_otherwise():
    probe = ProbeSection(steps=3, micro_batch=2, seq_len=16, grad_accum=3, lr=3e-3, device="cpu")
    result = runner.run_probe(CFG, probe, Policy(), _data(micro_batch=2, grad_accum=3), EmulatedBackend(), CPU)
    assert len(result.losses) == 3 and all(math.isfinite(v) for v in result.losses) and not result.diverged
    with pytest.raises(ValueError, match="probe.grad_accum"):
        runner.run_probe(CFG, probe, Policy(), _data(micro_batch=2), EmulatedBackend(), CPU)


def test_memory_model_keeps_one_micro_batch_of_activations_and_counts_the_accumulated_gradients():
    """Accumulation does not raise the activation peak, but it does keep the gradients alive through
    the later micro-batches' backward: a model that left them out would under-predict that peak."""
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=4)
    fp8 = {"decoder.layers.0.mlp.linear_fc1": Precision.FP8_CURRENT}
    one = predict_peak(cfg, fp8, seq_len=4096, micro_batch=1, param_dtype="bf16")
    four = predict_peak(cfg, fp8, seq_len=4096, micro_batch=1, param_dtype="bf16", grad_accum=4)
    assert (four.linear_inputs, four.other_activations, four.logits) == (one.linear_inputs, one.other_activations,
                                                                         one.logits)
    assert four.backward_peak == one.backward_peak + one.grads and four.step_peak == one.step_peak
    assert one.accumulated_grads == 0


def test_reference_key_changes_with_grad_accum_and_grad_accum_is_validated():
    space = Space(probe=ProbeSection(device="cpu"))
    keys = {reference_key(space, 1.0, CPU, space.probe.model_copy(update={"grad_accum": n})) for n in (1, 4)}
    assert len(keys) == 2  # a reference of 4x the tokens per step is another run
    with pytest.raises(UserError, match="probe.grad_accum"):
        parse_space({"probe": {"grad_accum": 0}}, file="space.yaml")
