"""The bitwise BF16/FP16 rounding of the compare step (precsearch.probe.damage.rounding) against the casts.

What could go wrong: a tie rounded away from even, a carry into the exponent lost, FP16's subnormals or its
overflow to infinity, a sign or a NaN changed; or the compiled chain (inductor) computing other values than
eager PyTorch does.
"""

import torch
from _floats import every_exponent, same_bits

from precsearch.probe.damage.rounding import round_to_bf16, round_to_fp16


def test_bf16_rounding_is_the_cast_for_every_exponent_and_boundary():
    x = every_exponent()
    assert x.numel() > 10**6 and torch.isnan(x).any() and torch.isinf(x).any()
    assert same_bits(round_to_bf16(x), x.to(torch.bfloat16).float())


def test_fp16_rounding_is_the_cast_for_every_exponent_and_boundary():
    x = every_exponent()
    want = x.to(torch.float16).float()
    assert (want == 0).any() and torch.isinf(want[torch.isfinite(x)]).any()  # underflow and overflow covered
    assert ((want.abs() < 2**-14) & (want != 0)).any()  # FP16 subnormals covered
    assert same_bits(round_to_fp16(x), want)


def test_the_edges_by_name():
    x = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24, 2.0**-25, 1.5 * 2**-25,
                      2.0**-14 - 2.0**-25, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.3895e38, float("inf"), float("nan")])
    assert same_bits(round_to_fp16(x), x.to(torch.float16).float())
    assert same_bits(round_to_bf16(x), x.to(torch.bfloat16).float())
    assert round_to_bf16(torch.tensor([1 + 2.0**-8]))[0] == 1.0  # a tie goes to the even neighbour
    assert round_to_bf16(torch.tensor([1 + 3 * 2.0**-8]))[0] == 1 + 2.0**-6


def test_compiled_rounding_is_the_eager_one():
    """Inductor (the CPU's here; CUDA's in tests/backends/test_gpu_damage.py) keeps the integer arithmetic."""
    torch._dynamo.reset()
    x = every_exponent(256)
    fused = torch.compile(lambda t: (round_to_bf16(t), round_to_fp16(t * 3.0) / 3.0), dynamic=True)
    bf16, fp16 = fused(x)
    assert same_bits(bf16, x.to(torch.bfloat16).float())
    assert same_bits(fp16, (x * 3.0).to(torch.float16).float() / 3.0)
