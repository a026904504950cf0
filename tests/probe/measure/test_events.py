"""Per-step events: loss spikes, gradient blow-ups and non-finite values, alone and in the probe loop."""

from __future__ import annotations

import math

import pytest
import torch

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.measure.events import StepMonitor, count_events
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.runner import run_probe

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64,
                  max_seq_len=32, rope_theta=10000.0)


def _replay(losses, grad_norms, spike=0.25, blowup=10.0):
    monitor = StepMonitor(spike, blowup)
    return [e for step, (loss, grad) in enumerate(zip(losses, grad_norms)) for e in monitor.observe(step, loss, grad)]


def test_a_smooth_run_has_no_events():
    """Falling loss and shrinking gradients are normal training; flagging them would penalise every probe."""
    losses = [5.0, 4.0, 3.5, 3.2, 3.0, 2.9, 2.8, 2.75]
    grads = [8.0, 5.0, 3.0, 2.0, 1.5, 1.2, 1.1, 1.0]
    assert _replay(losses, grads) == []


def test_a_loss_jump_above_the_running_mean_is_one_spike_with_its_baseline():
    """A spike must name its step and what it was compared with, or a reader cannot judge it."""
    losses = [3.0, 2.9, 2.8, 2.7, 4.0, 2.6]
    events = _replay(losses, [1.0] * len(losses))
    assert [(e.step, e.kind) for e in events] == [(4, "loss_spike")]
    assert events[0].value == 4.0 and 2.7 < events[0].baseline < 3.0  # the running mean of 3.0 .. 2.7


def test_a_gradient_norm_far_above_the_recent_median_is_a_blowup():
    grads = [1.0, 1.2, 0.9, 1.1, 1.0, 40.0, 1.0]
    events = _replay([3.0] * len(grads), grads)
    assert [(e.step, e.kind, e.value, e.baseline) for e in events] == [(5, "grad_blowup", 40.0, 1.0)]


def test_a_steady_rise_in_gradient_norm_is_not_a_blowup():
    """Doubling per step stays within 10x the recent median: a blow-up is a jump, not a trend."""
    grads = [1.0, 2.0, 4.0, 8.0, 16.0]
    assert _replay([3.0] * len(grads), grads) == []


def test_the_first_steps_only_feed_the_baselines():
    """At initialisation the loss can rise for a step; a spike there says nothing about the precision."""
    assert _replay([3.0, 6.0, 3.0, 2.9], [1.0, 50.0, 1.0, 1.0]) == []


def test_non_finite_values_are_events_and_leave_the_baselines_alone():
    """A NaN step must be reported; folding it into the running mean would hide every later spike."""
    losses = [3.0, 2.9, 2.8, 2.7, float("nan"), 2.7, 5.0]
    grads = [1.0, 1.0, 1.0, 1.0, 1.0, float("inf"), 1.0]
    events = _replay(losses, grads)
    assert [(e.step, e.kind) for e in events] == [(4, "non_finite"), (5, "non_finite"), (6, "loss_spike")]
    assert math.isnan(events[0].value) and events[1].value == math.inf


def test_count_events_reads_recorded_dicts():
    events = [e.to_dict() for e in _replay([3.0, 2.9, 2.8, 2.7, 4.0], [1.0, 1.0, 1.0, 1.0, 50.0])]
    assert count_events(events, "loss_spike") == 1 and count_events(events, "grad_blowup") == 1
    assert count_events(events, "non_finite") == 0


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(synthetic_tokens(20_000, CFG.vocab_size, 0), seq_len=16, micro_batch=2, seed=0,
                        eval_batches=1)


def _probe(**overrides) -> ProbeSection:
    fields = dict(steps=8, micro_batch=2, seq_len=16, lr=3e-3, lr_warmup_steps=0, seed=0, device="cpu")
    return ProbeSection(**(fields | overrides))


def test_the_probe_records_the_events_its_steps_show(data):
    """The runner must record exactly what the monitor sees in its losses, step by step, with its settings."""
    probe = _probe(spike_threshold=1e-4, grad_blowup_factor=1.01)  # hair-trigger: some steps will fire
    result = run_probe(CFG, probe, Policy.bf16(), data, EmulatedBackend(), torch.device("cpu"))
    replayed = [e.to_dict() for e in _replay(result.losses, result.grad_norms, 1e-4, 1.01)]
    assert result.events == replayed and result.events
    assert all(3 <= e["step"] < probe.steps for e in result.events)


def test_a_diverging_probe_stops_at_the_step_and_records_it(data):
    """Divergence must end the probe early with its step, so a blown-up trial costs few steps."""
    result = run_probe(CFG, _probe(steps=30, lr=30.0, schedule="constant", divergence_factor=1.05), Policy.bf16(),
                       data, EmulatedBackend(), torch.device("cpu"))
    assert result.diverged and result.diverged_step == len(result.losses) - 1 < 29
    assert f"step {result.diverged_step}" in result.reason and math.isnan(result.eval_loss)
