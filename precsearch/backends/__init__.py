"""Numeric backends behind one ABC (:class:`~precsearch.backends.base.Backend`).

``emulated`` runs everywhere (FP8 numerics in PyTorch). ``te`` (Transformer
Engine) and ``torchao`` are the GPU backends; they import their libraries only
when chosen.
"""

from __future__ import annotations

import torch

from precsearch.backends.base import Backend, BackendUnavailable, UnsupportedRecipe

__all__ = ["Backend", "BackendUnavailable", "UnsupportedRecipe", "get_backend", "resolve_device", "BACKEND_NAMES"]

BACKEND_NAMES = ("emulated", "te", "torchao")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when a GPU is visible, else cpu. ``cuda`` without a GPU is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("device 'cuda' was asked for but no CUDA GPU is visible; valid here: auto, cpu")
    return torch.device(name)


def get_backend(name: str, device: torch.device) -> Backend:
    """The backend called ``name`` (``auto`` picks one for ``device``)."""
    if name == "auto":
        name = "emulated"  # GPU backends are chosen explicitly until they are verified on hardware
    if name == "emulated":
        from precsearch.backends.emulated import EmulatedBackend

        return EmulatedBackend()
    if name in ("te", "torchao"):
        raise BackendUnavailable(
            f"backend '{name}' is not implemented in this version of precsearch; valid: emulated, auto"
        )
    raise BackendUnavailable(f"unknown backend '{name}'; valid: auto, {', '.join(BACKEND_NAMES)}")
