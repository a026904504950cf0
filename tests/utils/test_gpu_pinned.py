""":class:`precsearch.utils.pinned.PinnedBlock` on a GPU (the H200 through the device tool).

What would be wrong if these failed: the reading's host-kept states would not be page-locked (every reading's
copy to the device pageable and synchronous, seconds slower at the 8B space), views would overlap (one state
tensor overwriting another), or the block would stay registered after it is freed (page-locked memory leaking
with every clipping value of a study).
"""

from __future__ import annotations

import gc

import pytest
import torch

from precsearch.utils.pinned import PinnedBlock

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]


def test_views_are_page_locked_disjoint_and_round_trip_through_the_gpu():
    shapes = [(3, 5), (7,), (2, 2, 2)]
    block = PinnedBlock(shapes)
    views = [block.take(s) for s in shapes]
    assert all(v.is_pinned() and tuple(v.shape) == s for v, s in zip(views, shapes))
    sources = [torch.randn(s, device="cuda") for s in shapes]
    for v, s in zip(views, sources):
        v.copy_(s)
    for v, s in zip(views, sources):  # a later copy overwrote no earlier one
        assert torch.equal(v.to("cuda", non_blocking=True), s)


def test_a_freed_block_is_unregistered():
    """Its memory, still referenced here, is ordinary pageable memory once the block is gone."""
    block = PinnedBlock([(1024,)])
    memory = block.tensor
    assert memory.is_pinned()
    del block
    gc.collect()
    assert not memory.is_pinned()
    assert int(torch.cuda.cudart().cudaHostUnregister(memory.data_ptr())) != 0  # nothing left to unregister
