"""FP8-only weights (``fp8_weights``): after each optimizer step the backward reads the updated weights.

GPU only (H100/H200 via the device tool). ``FusedAdam``'s FP8 kernel writes a delayed-scaling weight's row-wise
data and leaves its transpose, made at init, marked valid; on Hopper the data gradient reads that transpose. What
would be wrong if these failed: every backward through an FP8 Linear uses the initial weights, which cost +39.9%
held-out loss in the 2,000-step soak (``std_fp32_fp32_fp8w``, H200, 2026-12-06) and which no short probe sees.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]


def _fp8_linear_and_optimizer():
    te = pytest.importorskip("transformer_engine.pytorch")
    from transformer_engine.common.recipe import DelayedScaling, Format

    from precsearch.backends.te_optimizer import build_optimizer, seed_master_weights

    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    torch.manual_seed(0)
    with te.quantized_model_init(enabled=True, recipe=recipe, preserve_high_precision_init_val=True):
        layer = te.Linear(256, 256, bias=False, params_dtype=torch.bfloat16, device="cuda")
    opt = build_optimizer(layer.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0, master_weights=True)
    seed_master_weights(opt)
    return te, recipe, layer, opt


def _steps(te, recipe, layer, opt, n: int) -> torch.Tensor:
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # every step's output gradient is all ones (the loss is the sum), so delayed scaling's amax history of it is
    # exact at the last backward too: with a mean-square loss in the loop (output gradients ~1e-4) the last
    # backward's ones saturated E5M2 at the history's scale, and its data gradient came out 1.8e-4 of the true
    # one (H100, 2026-12-07), a fault of the test, not of the weights
    for k in range(n + 1):
        x.grad = None
        with te.autocast(enabled=True, recipe=recipe):  # the last forward makes what the last backward reads
            y = layer(x)
        y.float().sum().backward()
        if k < n:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return x.grad.float()


def test_the_backward_reads_the_weights_the_step_wrote():
    te, recipe, layer, opt = _fp8_linear_and_optimizer()
    weight = layer.weight
    initial = weight.dequantize().float().clone()
    dgrad = _steps(te, recipe, layer, opt, 5)
    now = weight.dequantize().float()
    assert (now - initial).norm() / initial.norm() > 0.05, "the steps did not move the weight: the test cannot tell"
    expected = torch.ones(64, 256, device="cuda") @ now  # d(sum(x W^T))/dx = 1 W
    assert (dgrad - expected).norm() / expected.norm() < 0.05, "the data gradient used stale weights"


def test_the_optimizer_refreshes_fp8_weights_after_each_step():
    from precsearch.backends.te_optimizer import refresh_fp8_weight_transposes

    te, recipe, layer, opt = _fp8_linear_and_optimizer()
    assert refresh_fp8_weight_transposes in [h for h in opt._optimizer_step_post_hooks.values()]
