"""The max causal attention logit (:mod:`precsearch.probe.measure.attention_logit`)."""

from __future__ import annotations

import pytest
import torch

from precsearch.probe.measure.attention_logit import max_attention_logit


def _brute_force(q: torch.Tensor, k: torch.Tensor, scale: float) -> float:
    """Every logit in float64, GQA by repeating each kv head for its consecutive query heads, causal mask."""
    group = q.shape[1] // k.shape[1]
    keys = k.double().repeat_interleave(group, dim=1)
    logits = q.double() @ keys.transpose(-1, -2) * scale
    t = q.shape[2]
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    return logits.masked_fill(future, -torch.inf).max().item()


@pytest.mark.parametrize("chunk", [1, 3, 7, 512])
def test_matches_float64_brute_force_with_gqa(chunk):
    """Chunking over queries and kv heads must not change the max; a wrong head mapping or mask would."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 8, 7, 16), torch.randn(2, 2, 7, 16)
    got = max_attention_logit(q, k, 16 ** -0.5, query_chunk=chunk)
    assert got.item() == pytest.approx(_brute_force(q, k, 16 ** -0.5), rel=1e-5)


def _planted(b: int = 2, h: int = 8, hkv: int = 2, t: int = 6, d: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(b, h, t, d), torch.zeros(b, hkv, t, d)


def test_future_keys_are_ignored():
    """A huge logit with a key after its query never reaches the softmax: reading it would be a false alarm."""
    q, k = _planted()
    q[0, 0, 4, 0], k[0, 0, 1, 0] = 7.0, 1.0  # visible: key 1 <= query 4, logit 7
    q[0, 0, 2, 1], k[0, 0, 5, 1] = 100.0, 100.0  # future: key 5 > query 2
    assert max_attention_logit(q, k, scale=0.5).item() == pytest.approx(3.5)


def test_query_head_reads_its_own_kv_group():
    """With 8 query heads and 2 kv heads, head 5 reads kv head 1 (heads 4-7 share it), not kv head 0."""
    q, k = _planted()
    q[0, 5, 3, 0] = 2.0
    k[0, 1, 2, 0] = 3.0  # kv head of head 5: logit 6
    k[0, 0, 2, 0] = 1000.0  # kv head 0 serves heads 0-3 only
    assert max_attention_logit(q, k, scale=1.0).item() == pytest.approx(6.0)


def test_max_batch_samples_the_first_sequences():
    """A stat step may look at one sequence only; a planted logit in sequence 1 is then not seen."""
    q, k = _planted()
    q[0, 0, 1, 0], k[0, 0, 0, 0] = 1.0, 1.0
    q[1, 0, 1, 0], k[1, 0, 0, 0] = 9.0, 9.0
    assert max_attention_logit(q, k, 1.0, max_batch=1).item() == pytest.approx(1.0)
    assert max_attention_logit(q, k, 1.0).item() == pytest.approx(81.0)


def test_nan_is_reported_not_hidden():
    q, k = _planted()
    q[0, 0, 3, 0] = torch.nan
    assert torch.isnan(max_attention_logit(q, k, 1.0))


@pytest.mark.parametrize("q_shape,k_shape", [((1, 6, 4, 8), (1, 4, 4, 8)), ((1, 4, 4, 8), (1, 2, 5, 8)),
                                             ((4, 4, 8), (1, 2, 4, 8))])
def test_shapes_that_do_not_fit_are_refused(q_shape, k_shape):
    with pytest.raises(ValueError):
        max_attention_logit(torch.zeros(q_shape), torch.zeros(k_shape), 1.0)
