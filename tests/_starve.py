"""A parameter starved of gradients: the state that made FP8StateAdamW's FP8 moments NaN (issue 54).

Shared by the CPU test of the eager path and the GPU test of the Triton kernels.
"""

from __future__ import annotations

import torch

from precsearch.backends.fp8_state_adam import dequantize_state


def starve(opt, p, steps: int, *, busy: int = 5, seed: int = 0) -> int | None:
    """Give ``p`` a few steps of gradients, then zero gradients (a token the data stops holding); return the first
    step whose weight or dequantized moments are not finite, else None.

    The gradients are sparse (half the elements exact zeros, a column of ones): in a block whose values span
    more than E4M3's range, the small ones are stored as zero codes, the elements that turned ``0 * inf`` into NaN
    once the block's amax shrank below FP32's normal range (issue 54).
    """
    g = torch.Generator(device=p.device).manual_seed(seed)
    for step in range(steps):
        grad = torch.zeros_like(p)
        if step < busy:
            grad = torch.randn(p.shape, generator=g, device=p.device) * 1e-2
            grad = grad * (torch.rand(p.shape, generator=g, device=p.device) < 0.5)
            grad[:, 0] = 1.0
        p.grad = grad.to(p.dtype)
        opt.step()
        state = opt.state[p]
        moments = [dequantize_state(state[n], state.get(f"{n}_scale_inv"), opt.storage[n], root=n == "exp_avg_sq")
                   for n in ("exp_avg", "exp_avg_sq")]
        if not all(torch.isfinite(x).all() for x in (p.float(), *moments)):
            return step
    return None
