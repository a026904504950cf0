"""A probe's seed fixes the emulated NVFP4 stochastic-rounding streams (they start from torch.initial_seed())."""

from __future__ import annotations

import torch

from precsearch.backends.emulated import EmulatedBackend
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.runner import build_probe

CFG = ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
UNIT = "decoder.layers.0.mlp.linear_fc1"


def _grad_draws(seed: int) -> torch.Tensor:
    """The stochastic-rounding draws of the first NVFP4 gradient cast of a probe built with ``seed``."""
    policy = Policy(rules=(Rule("u", (UNIT,), Precision.NVFP4),))
    model = build_probe(CFG, policy, EmulatedBackend(), torch.device("cpu"), seed)
    scaler = model.get_submodule(UNIT).grad_output_scaler
    assert scaler.stochastic
    return torch.rand(8, generator=scaler._stream(torch.device("cpu")))


def test_the_probe_seed_fixes_the_stochastic_rounding_stream():
    assert torch.equal(_grad_draws(3), _grad_draws(3))
    assert torch.initial_seed() == 3  # not the process's random initial seed
    assert not torch.equal(_grad_draws(3), _grad_draws(4))
