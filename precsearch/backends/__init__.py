"""Numeric backends behind one ABC (:class:`~precsearch.backends.base.Backend`), listed in :mod:`.registry`.

``emulated`` runs everywhere (FP8 numerics in PyTorch). ``te`` (Transformer
Engine) and ``torchao`` are the GPU backends; they import their libraries only
when chosen.

Public API: :func:`get_backend` and :func:`resolve_device` (a space's ``backend`` and ``probe.device``
made real), :func:`backend_support` and :func:`chosen_backend` (what a CPU space's backend runs, answered
without torch), the registry's names, the contract's types, and what other layers use of the backends
(capability checks, tensor statistics, the fused loss, tensor parallelism). Importing this package
imports no torch: the names whose modules need it (:class:`~precsearch.backends.base.Backend` among
them) are imported on first use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from precsearch.backends.registry import AUTO, BACKEND_CHOICES, BACKEND_NAMES, BACKENDS
from precsearch.backends.support import BackendSupport, BackendUnavailable, UnsupportedRecipe
from precsearch.utils.lazy import lazy_exports

if TYPE_CHECKING:
    import torch

    from precsearch.backends.base import Backend

__all__ = ["AUTO", "BACKENDS", "BACKEND_CHOICES", "BACKEND_NAMES", "Backend", "BackendSupport", "BackendUnavailable",
           "EmulatedBackend", "EmulatedFP8Linear", "LOGIT_BYTES", "LayerStats", "PARTIAL_GRAD", "PolicyRuntime", "SPLIT",
           "TensorParallel", "TensorStats", "UnsupportedRecipe", "backend_support", "chosen_backend",
           "compact_fp8_states", "emulation_note", "fp8_attention_model_problem", "get_backend", "gpu_capability",
           "resolve_device"]

_WHERE = {
    "Backend": "base", "emulation_note": "capability", "gpu_capability": "capability",
    "LOGIT_BYTES": "cross_entropy", "EmulatedBackend": "emulated", "EmulatedFP8Linear": "emulated",
    "PolicyRuntime": "policy_runtime", "fp8_attention_model_problem": "te_knobs",
    "compact_fp8_states": "te_optimizer", "LayerStats": "tensor_stats", "TensorStats": "tensor_stats",
    "PARTIAL_GRAD": "tp_group", "SPLIT": "tp_group", "TensorParallel": "tp_group",
}
"""Public name -> its module, imported on first use: each of these modules imports torch."""

__getattr__ = lazy_exports(__name__, _WHERE)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when a GPU is visible, else cpu. ``cuda`` without a GPU is refused."""
    import torch  # whether a GPU is visible is torch's to say

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("device 'cuda' was asked for but no CUDA GPU is visible; valid here: auto, cpu")
    return torch.device(name)


def _auto_backend(device: torch.device | str, needs: Iterable = ()) -> str:
    """Transformer Engine on a GPU where it imports and runs every precision in ``needs``, else emulated.

    So a Blackwell space (MXFP8, NVFP4) runs on TE on a 10.x GPU and emulated elsewhere.
    """
    kind = device.split(":")[0] if isinstance(device, str) else device.type
    if kind == "cuda" and BACKENDS["te"].import_error() is None:
        from precsearch.backends.capability import te_support

        support = te_support(device)
        if all(support[p] is None for p in needs):
            return "te"
    return "emulated"


def get_backend(name: str, device: torch.device, needs: Iterable = ()) -> Backend:
    """The backend called ``name`` (``auto`` picks one for ``device`` that runs every precision in
    ``needs``); names: :data:`BACKENDS`."""
    if name == AUTO:
        name = _auto_backend(device, needs)
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend '{name}'; valid: {', '.join(BACKEND_CHOICES)}")
    if (error := BACKENDS[name].import_error()) is not None:
        raise BackendUnavailable(f"backend '{name}': {error}; valid here: emulated")
    return BACKENDS[name].make()


def backend_support(name: str, device: str, needs: Iterable = ()) -> BackendSupport | None:
    """What backend ``name`` (``auto`` resolved) runs on the device a space names (``probe.device``), answered
    as data without torch; None when the answer takes a query of the machine (``auto`` and ``cuda`` devices:
    which GPU, if any; a backend whose registry entry has no ``support``) or ``name`` is unknown: then
    :func:`get_backend` builds the backend and says."""
    if device != "cpu":
        return None
    if name == AUTO:
        name = _auto_backend(device, needs)
    entry = BACKENDS.get(name)
    return entry.support() if entry is not None and entry.support is not None else None


def chosen_backend(name: str, device: str, needs: Iterable = ()) -> tuple[str, str]:
    """The backend (``auto`` resolved) and device (``auto`` resolved) a space's ``backend`` and ``probe.device``
    run on here, as names: ``("emulated", "cpu")``. A CPU space's answer imports no torch (:func:`backend_support`).

    Raises:
        BackendUnavailable: as :func:`resolve_device` and :func:`get_backend`.
    """
    support = backend_support(name, device, needs)
    if support is not None:
        return support.name, device
    resolved = resolve_device(device)
    return get_backend(name, resolved, needs).name, str(resolved)
