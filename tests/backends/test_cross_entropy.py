"""The probe's loss: F.cross_entropy's float32 math with Megatron-Core's memory (one float32 copy of the logits)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from precsearch.backends.cross_entropy import LOGIT_BYTES, cross_entropy
from precsearch.probe.memory.live_bytes import LiveBytes


def _case(dtype: torch.dtype, tokens: int = 64, vocab: int = 4096):
    gen = torch.Generator().manual_seed(0)
    logits = (8 * torch.randn(2, tokens // 2, vocab, generator=gen)).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (2, tokens // 2), generator=gen)
    targets[0, :3] = -100  # ignored, as in F.cross_entropy
    return logits, targets


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loss_and_gradient_are_f_cross_entropy_of_the_float32_logits(dtype):
    logits, targets = _case(dtype)
    before = logits.detach().clone()
    ours = cross_entropy(logits, targets)
    (grad,) = torch.autograd.grad(ours, logits)
    theirs = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    (expected,) = torch.autograd.grad(theirs, logits)
    assert ours.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    # the same float32 values up to summation order, then the same cast to the logits' dtype (a BF16 value
    # may round to the next one: one BF16 step is at most 2^-7 of it)
    torch.testing.assert_close(grad.float(), expected.float(), atol=1e-12,
                               rtol=1e-6 if dtype == torch.float32 else 2**-7)
    assert torch.equal(logits.detach(), before)  # float32 logits are copied, never written
    assert grad[0, :3].abs().max() == 0  # ignored targets give no gradient


def _peak_bytes(loss_fn, logits, targets) -> int:
    with LiveBytes(logits, targets) as mode:
        loss = loss_fn(logits, targets)
        loss.backward()
        del loss
    return mode.peak


def test_it_holds_one_float32_copy_and_the_bf16_gradient_where_f_cross_entropy_held_three_copies():
    """At the 8B shape the three float32 copies of F.cross_entropy were 5.9 GiB, the probe's 3 GiB over
    Megatron-Core; this loss holds LOGIT_BYTES per logit (4 + 2), what the memory model counts."""
    tokens, vocab = 256, 8192
    logits, targets = _case(torch.bfloat16, tokens, vocab)
    n = tokens * vocab
    ours = _peak_bytes(cross_entropy, logits, targets)
    logits.grad = None
    theirs = _peak_bytes(lambda x, t: F.cross_entropy(x.float().flatten(0, 1), t.flatten()), logits, targets)
    assert n * LOGIT_BYTES <= ours <= n * LOGIT_BYTES * 1.05  # the softmax, the BF16 gradient, per-row vectors
    assert theirs >= n * 3 * 4  # the log-softmax output, the gradient in and the gradient out


def test_a_second_backward_through_the_same_graph_is_refused():
    """The backward writes the gradient into the softmax it kept: it can run only once."""
    logits, targets = _case(torch.float32)
    loss = cross_entropy(logits, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError):
        loss.backward()
