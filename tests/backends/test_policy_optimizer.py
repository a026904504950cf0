"""``PolicyRuntime.build_optimizer``: the optimizer the policy's memory settings ask for, whoever runs the layers.

A framework that runs FP8 itself (Accelerate's torchao path) hands precsearch an unconverted model; a user
on CPU converts with the emulated backend. If these failed, the optimizer knobs would be dropped for a
plain AdamW without a word (what an unconverted model got before), or be refused where precsearch's own
``FP8StateAdamW`` runs them.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precsearch.backends.fp8_state_adam import FP8StateAdamW
from precsearch.policy import MemoryKnobs, Policy, PolicyError, PolicyRuntime
from precsearch.precision import Precision

FP8_STATES = MemoryKnobs(master_weights=True, moment_dtype="fp8_block", master_dtype="remainders")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 16)).to(torch.bfloat16)


def test_fp8_moments_get_precsearchs_optimizer_on_an_unconverted_model():
    model = _model()
    optimizer = PolicyRuntime(Policy(default=Precision.BF16, memory=FP8_STATES)).build_optimizer(model, lr=1e-3)
    assert isinstance(optimizer, FP8StateAdamW)
    assert (optimizer.master, optimizer.storage) == ("remainders", {"exp_avg": "fp8_block", "exp_avg_sq": "fp8_block"})


def test_the_emulated_backend_takes_the_knobs_precsearchs_optimizer_keeps():
    """The layers' backend has nothing to do with FP8 moments; the optimizer keeps them."""
    policy = PolicyRuntime(Policy(default=Precision.FP8_CURRENT, memory=FP8_STATES))
    model = policy.apply(_model())
    assert isinstance(policy.build_optimizer(model, lr=1e-3), FP8StateAdamW)


def test_knobs_only_fusedadam_keeps_are_refused_off_a_gpu_naming_them():
    bf16_moments = PolicyRuntime(Policy(default=Precision.BF16, memory=MemoryKnobs(moment_dtype="bf16")))
    with pytest.raises(PolicyError, match=r"moment_dtype=bf16.*FusedAdam.*CUDA"):
        bf16_moments.build_optimizer(_model(), lr=1e-3)
    with pytest.raises(PolicyError, match="moment_dtype=bf16"):
        PolicyRuntime(Policy(default=Precision.FP8_CURRENT, memory=MemoryKnobs(moment_dtype="bf16"))).apply(_model())


def test_default_knobs_keep_torch_adamw():
    assert type(PolicyRuntime(Policy()).build_optimizer(_model(), lr=1e-3)) is torch.optim.AdamW
