"""The CPU byte counter: counts what ops create, once per storage, until freed."""

from __future__ import annotations

import torch

from precsearch.probe.memory.live_bytes import LiveBytes


def test_it_counts_new_storages_once_and_forgets_freed_ones():
    x = torch.ones(1000)
    with LiveBytes(x) as mode:
        view = x.view(10, 100)  # x's storage: not new memory
        assert mode.live == 0
        a = x * 2  # 4000 bytes
        a.add_(1)  # in place: the same storage
        b = a[:10].clone()  # 40 bytes
        assert mode.live == 4040
        del a
        c = torch.zeros(500)  # 2000 bytes, after a's 4000 were freed
    assert mode.peak == 4040 and mode.live == 2040
    assert view.shape == (10, 100) and b.numel() == 10 and c.numel() == 500
