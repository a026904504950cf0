"""``keep_states: auto`` (:mod:`precsearch.probe.damage.placement`): the states go to the device only where they fit.

If these fail, a study on an 80 GB GPU could keep 35 GiB of states beside its trials and run them out of memory
(a wrong "fits"), or an H200 study would page-lock its states in host memory for nothing (a wrong "does not
fit"). The byte counts are checked against the tensors a reader really keeps, so the rule cannot drift from them.
"""

from __future__ import annotations

import pytest
import torch

from precsearch.config.space import DamageSection, ProbeSection
from precsearch.probe.damage import placement
from precsearch.probe.damage.reader import _grad_tensors, _state_tensors
from precsearch.probe.damage import DamageReader
from precsearch.backends.emulated import EmulatedBackend
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import PRESETS, ModelConfig
from precsearch.policy import Policy

GIB = 2**30
CUDA = torch.device("cuda")
H200, H100 = 143_771_287_552, 85_031_714_816  # total_memory as torch reports the two cards
LLAMA3_8B_PROBE = PRESETS["llama3-8b"].with_overrides(n_layers=4)
PROBE_8B = ProbeSection(steps=40, micro_batch=1, seq_len=4096, lr=3e-4, device="cuda", param_dtype="bf16")
SETTINGS = DamageSection()


def test_the_8b_space_keeps_its_first_clip_values_states_on_an_h200_and_none_on_an_h100():
    """The shipped 8B space: 2 states of 17.6 GiB and 20.8 GiB of BF16 gradients (56.0 GiB held, as measured on
    the H200 on 2026-12-02) beside a ~31 GiB trial. The first clipping value's states fit an H200; the second's
    would take the device past 140 GiB; neither fits an H100."""
    held = placement.state_bytes(LLAMA3_8B_PROBE, 2) + placement.gradient_bytes(LLAMA3_8B_PROBE, PROBE_8B, SETTINGS, 2)
    assert held / GIB == pytest.approx(55.98, abs=0.05)
    first = dict(n_states=2, held=0, peak=31 * GIB)
    assert placement.states_fit(LLAMA3_8B_PROBE, PROBE_8B, SETTINGS, CUDA, total=H200, **first)
    assert not placement.states_fit(LLAMA3_8B_PROBE, PROBE_8B, SETTINGS, CUDA, total=H100, **first)
    second = dict(n_states=2, held=held, peak=held + 28 * GIB)
    assert not placement.states_fit(LLAMA3_8B_PROBE, PROBE_8B, SETTINGS, CUDA, total=H200, **second)


def test_a_large_peak_of_the_trials_keeps_the_states_off_the_device():
    """The working set is the larger of the BF16 run's and the trials' own peak: a trial that peaked at 80 GiB
    leaves no room for 56 GiB more on an H200."""
    assert not placement.states_fit(LLAMA3_8B_PROBE, PROBE_8B, SETTINGS, CUDA, 2, 0, total=H200, peak=80 * GIB)


def test_a_cpu_never_keeps_them_on_the_device():
    assert not placement.states_fit(LLAMA3_8B_PROBE, PROBE_8B, SETTINGS, torch.device("cpu"), 2, 0, total=10**15,
                                    peak=0)


def test_the_byte_counts_are_those_of_the_tensors_a_reader_keeps():
    """On a tiny probe (CPU), the predicted state and gradient bytes equal the bytes of what the reader holds,
    except the first state's moments (none at step 0: the count is an upper bound by those)."""
    cfg = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
    probe = ProbeSection(steps=4, micro_batch=2, seq_len=32, lr=3e-3, lr_warmup_steps=1, device="cpu",
                         param_dtype="bf16")
    settings = DamageSection(states=[0.5, 1.0], batches=3, keep_states="host")  # auto: disk on a CPU
    data = TokenBatches(synthetic_tokens(20_000, 256, seed=0), seq_len=32, micro_batch=2, seed=0, eval_batches=1)
    reader = DamageReader(cfg, probe, data, EmulatedBackend(), torch.device("cpu"), settings)
    sides = reader.bf16_sides(None)
    kept_states = sum(t.numel() * t.element_size() for state, _ in sides for t in _state_tensors(state))
    kept_grads = sum(t.numel() * t.element_size() for _, side in sides for t in _grad_tensors(side))
    assert kept_states == placement.state_bytes(cfg, 2)
    assert kept_grads == placement.gradient_bytes(cfg, probe, settings, 2)
