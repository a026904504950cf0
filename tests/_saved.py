"""What autograd saves for the backward, counted by storage (imported by the memory-rule tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def saved_storage_bytes(step: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``step()`` and return its result and the bytes of the storages autograd saved meanwhile: each storage
    once, Parameters skipped, views of them (a Linear's ``weight.t()``) counted, as a saved-bytes listing has them."""
    import torch

    storages: dict[int, int] = {}

    def keep(t):
        if not isinstance(t, torch.nn.Parameter):
            storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        result = step()
    return result, sum(storages.values())
