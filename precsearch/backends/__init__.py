"""Numeric backends behind one ABC (:class:`~precsearch.backends.base.Backend`), listed in :mod:`.registry`.

``emulated`` runs everywhere (FP8 numerics in PyTorch). ``te`` (Transformer
Engine) and ``torchao`` are the GPU backends; they import their libraries only
when chosen.
"""

from __future__ import annotations

import torch

from precsearch.backends.base import Backend, BackendUnavailable, UnsupportedRecipe
from precsearch.backends.registry import AUTO, BACKEND_CHOICES, BACKEND_NAMES, BACKENDS

__all__ = ["BACKENDS", "BACKEND_CHOICES", "BACKEND_NAMES", "Backend", "BackendUnavailable", "UnsupportedRecipe",
           "get_backend", "resolve_device"]


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when a GPU is visible, else cpu. ``cuda`` without a GPU is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("device 'cuda' was asked for but no CUDA GPU is visible; valid here: auto, cpu")
    return torch.device(name)


def _auto_backend(device: torch.device) -> str:
    """Transformer Engine on a GPU where it imports, else the emulated backend."""
    if device.type == "cuda" and BACKENDS["te"].import_error() is None:
        return "te"
    return "emulated"


def get_backend(name: str, device: torch.device) -> Backend:
    """The backend called ``name`` (``auto`` picks one for ``device``); names: :data:`BACKENDS`."""
    if name == AUTO:
        name = _auto_backend(device)
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend '{name}'; valid: {', '.join(BACKEND_CHOICES)}")
    if (error := BACKENDS[name].import_error()) is not None:
        raise BackendUnavailable(f"backend '{name}': {error}; valid here: emulated")
    return BACKENDS[name].make()
