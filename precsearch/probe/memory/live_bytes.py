"""Bytes held by the tensors a piece of code creates, where no allocator counts them (the CPU).

:class:`LiveBytes` is a dispatch mode: every tensor an op returns while it is active is counted by its
storage (views and in-place results share one), until that storage is freed; ``peak`` is the most
held at once, forward and backward (autograd runs the backward's ops under the same mode). Used to
check what a loss or a layer keeps (``tests/backends/test_cross_entropy.py``, ``bench_loss.py@4232a8b``).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by tensors created while active; the storages of ``existing`` tensors
    (alive before, so a view of them is no new memory) are not counted."""

    def __init__(self, *existing: torch.Tensor):
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = {t.untyped_storage().data_ptr() for t in existing}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._seen:
                    self._seen.add(key)
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key, storage.nbytes())
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes
