"""The rowwise recipe (the demo of adding a precision): its emulation is torchao's rowwise recipe, to the bit.

The contract test runs every consumer over it; here its numerics are held against the library that defines
it. If this fails, the emulated backend's rowwise probes measure a different recipe than torchao trains with.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from precsearch.backends.capability import torchao_available
from precsearch.backends.emulated import EmulatedBackend
from precsearch.backends.torchao_backend import TorchaoBackend
from precsearch.precision import LayerRecipe, Precision


@pytest.mark.skipif(not torchao_available(), reason="torchao does not import")
def test_the_emulation_is_torchaos_rowwise_recipe():
    """Forward output, input gradient and weight gradient of one Linear agree exactly with torchao's emulation
    mode (E4M3 everywhere, power-of-two scales per row, per column for the wgrad operands)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 128, bias=False))
    recipes = {"0": LayerRecipe(Precision.FP8_ROWWISE)}
    ours = EmulatedBackend().convert(copy.deepcopy(model), recipes)
    theirs = TorchaoBackend(emulate=True).convert(copy.deepcopy(model), recipes)
    x = torch.randn(64, 256)
    grad = torch.randn(64, 128)
    results = []
    for converted in (ours, theirs):
        xi = x.clone().requires_grad_()
        out = converted(xi)
        out.backward(grad)
        weight = next(p for p in converted.parameters())
        results.append((out.detach().float(), xi.grad, weight.grad))
    for mine, ref in zip(*results):
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)
