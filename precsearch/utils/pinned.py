"""One block of page-locked host memory of an exact size, for many tensors that live and die together.

PyTorch's ``pin_memory=True`` goes through its caching host allocator, which rounds every block up to a power of
two and page-locks each with its own ``cudaHostAlloc``: the fixed-state reading's states at the 8B space (one
2.1 GB tensor per embedding, output layer and each of its moments, 35 GiB in all) would lock far more memory
than they hold, one block at a time. :class:`PinnedBlock` takes one plain host tensor of the exact total size,
touches its pages with PyTorch's parallel fill (so the kernel maps them on every core, not one page at a time
inside the registration), page-locks it with ``cudaHostRegister``, and hands out views into it. The views are
page-locked memory to CUDA (fast, asynchronous copies) for as long as the block lives; when it is freed it is
unregistered first. ``bench_pinned.py@c1936b3`` times it against the per-tensor way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


class PinnedBlock:
    """``sizes`` float32 tensors' worth of page-locked host memory, handed out as views by :meth:`take`.

    Keep the block referenced as long as its views are used: once it is collected the memory is unregistered
    (the views stay valid, as ordinary pageable memory).
    """

    def __init__(self, shapes: Sequence[Sequence[int]], dtype: torch.dtype = torch.float32):
        self._shapes = [tuple(s) for s in shapes]
        total = sum(math.prod(s) for s in self._shapes)
        self.tensor = torch.empty(total, dtype=dtype)
        self.tensor.zero_()  # maps every page now, on all of PyTorch's threads
        self._ptr = self.tensor.data_ptr()
        self._registered = False
        if total:
            _check(torch.cuda.cudart().cudaHostRegister(self._ptr, total * self.tensor.element_size(), 0))
            self._registered = True
        self._next = 0

    def take(self, shape: Sequence[int]) -> torch.Tensor:
        """The next view, of ``shape`` (the shapes given at construction, in their order)."""
        n = math.prod(shape)
        view = self.tensor[self._next:self._next + n].view(tuple(shape))
        self._next += n
        return view

    def __del__(self) -> None:
        if getattr(self, "_registered", False):
            try:
                torch.cuda.cudart().cudaHostUnregister(self._ptr)
            except (RuntimeError, AttributeError):  # CUDA or the interpreter shutting down: the OS frees it
                pass
            self._registered = False


def _check(error) -> None:
    if int(error) != 0:
        raise RuntimeError(f"cudaHostRegister failed with CUDA error {int(error)}")
