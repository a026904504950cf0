"""Which precision each GPU backend can run on which GPU, and why not.

Everything here is a pure function of a CUDA compute capability (and, for
Transformer Engine's block scaling, the CUDA version torch was built with), so
the tables can be unit-tested on a CPU with a made-up capability. The only
functions that touch the machine are :func:`gpu_capability`,
:func:`cuda_version`, :func:`te_import_error` and :func:`torchao_import_error`;
the libraries are imported inside those functions, never at module import.

Rules, as Transformer Engine 2.20.2 states them in
``transformer_engine/pytorch/quantization.py`` (``_compute_fp8_support``,
``_compute_fp8_block_scaling_support``, ``_compute_mxfp8_support``,
``_compute_nvfp4_support``):

* per-tensor FP8 (``DelayedScaling``, ``Float8CurrentScaling``): compute
  capability 8.9 (Ada) or higher; on Ada also CUDA >= 12.1 (and cuBLASLt
  >= 12.1.3, which ships with it);
* ``Float8BlockScaling``: compute capability 9.0 (Hopper) or higher and CUDA
  >= 12.9;
* ``MXFP8BlockScaling``: compute capability 10.x or 11.x (Blackwell); TE
  refuses 12.0+ ("not supported on 12.0+ architectures yet");
* ``NVFP4BlockScaling``: compute capability 10.0 or higher.

torchao (0.16, ``torchao/float8``) trains in FP8 through ``torch._scaled_mm``,
which needs compute capability 8.9 or higher (its rowwise-scaled GEMM: 9.0);
precsearch maps the recipes that name a torchao recipe onto it (``fp8_current``
as ``tensorwise``, ``fp8_rowwise`` as ``rowwise``; see
:mod:`precsearch.backends.torchao_backend`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from precsearch.backends.support import BackendUnavailable
from precsearch.precision import Precision
from precsearch.recipes import ADA, BLACKWELL, HOPPER, RECIPES, Capability, recipe_for

if TYPE_CHECKING:
    import torch

#: CUDA version TE asks for FP8 on Ada (a recipe's own minimum is its ``te_min_cuda``).
TE_ADA_MIN_CUDA: tuple[int, int] = (12, 1)

NO_GPU_TE = "Transformer Engine needs a CUDA GPU"
NO_GPU_TORCHAO = "torchao float8 training needs a CUDA GPU"

#: Why torchao cannot run a precision whatever the GPU (each recipe's ``torchao_never``).
TORCHAO_NEVER: dict[Precision, str] = {p: r.torchao_never for p, r in RECIPES.items() if r.torchao_never}


def architecture(cap: Capability) -> str:
    """A GPU family name for a compute capability, for messages ("Hopper")."""
    major, minor = cap
    if major >= 12:
        return "consumer Blackwell"
    if major >= 10:
        return "Blackwell"
    if major == 9:
        return "Hopper"
    if (major, minor) == (8, 9):
        return "Ada"
    if major == 8:
        return "Ampere"
    if major == 7:
        return "Volta/Turing"
    return "pre-Volta"


def _fmt(cap: Capability) -> str:
    return f"{cap[0]}.{cap[1]}"


def _needs(what: str, need: Capability, have: Capability) -> str:
    """'MXFP8 needs compute capability 10.0 (Blackwell); this GPU is 9.0 (Hopper)'."""
    return (
        f"{what} needs compute capability {_fmt(need)} ({architecture(need)}); "
        f"this GPU is {_fmt(have)} ({architecture(have)})"
    )


def parse_cuda_version(text: str | None) -> tuple[int, int] | None:
    """``"12.9"`` -> ``(12, 9)``; None (CPU-only torch) or an unparsable string -> None."""
    if not text:
        return None
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def te_reason(
    precision: Precision, cap: Capability | None, cuda: tuple[int, int] | None = None
) -> str | None:
    """None if Transformer Engine runs ``precision`` on a GPU of capability ``cap``, else why not.

    Args:
        precision: The layer precision.
        cap: The GPU's compute capability, or None when there is no CUDA GPU.
        cuda: The CUDA version torch was built with; None skips the CUDA-version checks.
    """
    recipe = recipe_for(precision)
    if not recipe.low:
        return None
    if cap is None:  # as te_support says it without a GPU, whatever the recipe
        return NO_GPU_TE
    if recipe.te_never:
        return recipe.te_never
    label, need = recipe.spec.label, recipe.spec.min_capability
    if cap < need:
        return _needs(label, need, cap)
    upper = recipe.te_max_capability
    if upper is not None and cap >= upper:
        return (
            f"Transformer Engine does not run {label} on compute capability {_fmt(upper)}+ "
            f"yet; this GPU is {_fmt(cap)} ({architecture(cap)})"
        )
    if cuda is None:
        return None
    built = f"torch was built with CUDA {_fmt(cuda)}"
    if recipe.te_min_cuda is not None and cuda < recipe.te_min_cuda:
        return f"{label} needs CUDA {_fmt(recipe.te_min_cuda)} or newer; {built}"
    if cap < HOPPER and cuda < TE_ADA_MIN_CUDA:
        return f"{label} on Ada needs CUDA {_fmt(TE_ADA_MIN_CUDA)} or newer; {built}"
    return None


def te_table(cap: Capability | None, cuda: tuple[int, int] | None = None) -> dict[Precision, str | None]:
    """:func:`te_reason` for every precision."""
    return {p: te_reason(p, cap, cuda) for p in Precision}


def torchao_reason(precision: Precision, cap: Capability | None) -> str | None:
    """None if the torchao backend runs ``precision`` on a GPU of capability ``cap``, else why not."""
    recipe = recipe_for(precision)
    if not recipe.low:
        return None
    if recipe.torchao_never:
        return recipe.torchao_never
    if cap is None:
        return NO_GPU_TORCHAO
    need = max(ADA, recipe.spec.min_capability)  # torch._scaled_mm: 8.9; its rowwise-scaled GEMM: 9.0
    if cap < need:
        return _needs(f"{recipe.spec.label} (torch._scaled_mm)", need, cap)
    return None


def torchao_table(cap: Capability | None) -> dict[Precision, str | None]:
    """:func:`torchao_reason` for every precision."""
    return {p: torchao_reason(p, cap) for p in Precision}


#: Recipes only Blackwell's tensor cores run; elsewhere they are emulated.
BLACKWELL_ONLY = tuple(p for p, r in RECIPES.items() if r.spec.min_capability == BLACKWELL)


def emulation_note(backend: str, precisions, device: torch.device | str) -> str | None:
    """A note for the user when Blackwell recipes will run emulated, else None.

    Args:
        backend: The resolved backend name.
        precisions: Every precision the space can choose.
        device: Where the probes run.
    """
    asked = [p.value for p in BLACKWELL_ONLY if p in set(precisions)]
    if backend != "emulated" or not asked:
        return None
    return (f"note: {' and '.join(asked)} run emulated on {device} (backend emulated): the loss follows "
            "Transformer Engine's Blackwell recipes, but the speed and memory measured here are not a B200's. "
            "On a GPU of compute capability 10.x, backend te (or auto) runs them on Transformer Engine.")


def unavailable_table(reason: str) -> dict[Precision, str | None]:
    """Every low-precision choice refused with ``reason``; BF16 allowed."""
    return {p: (reason if p.is_fp8 else None) for p in Precision}


# --- the machine ------------------------------------------------------------------


def gpu_capability(device: torch.device | str) -> Capability | None:
    """Compute capability of ``device``; None when it is not a usable CUDA device."""
    import torch  # the machine's question: the tables above need no torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def cuda_version() -> tuple[int, int] | None:
    """The CUDA version torch was built with (None for a CPU-only build)."""
    import torch

    return parse_cuda_version(torch.version.cuda)


@functools.lru_cache(maxsize=None)
def te_import_error() -> str | None:
    """None if ``transformer_engine.pytorch`` imports, else a sentence saying why not."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # ImportError, or OSError/RuntimeError from its CUDA libraries
        return f"Transformer Engine is not importable ({type(exc).__name__}: {exc})"
    return None


@functools.lru_cache(maxsize=None)
def torchao_import_error() -> str | None:
    """None if ``torchao.float8`` imports, else a sentence saying why not."""
    try:
        import torchao.float8  # noqa: F401
    except Exception as exc:
        return f"torchao is not importable ({type(exc).__name__}: {exc})"
    return None


def te_available() -> bool:
    """True when Transformer Engine's PyTorch API imports here."""
    return te_import_error() is None


def torchao_available() -> bool:
    """True when ``torchao.float8`` imports here."""
    return torchao_import_error() is None


def te_support(device: torch.device | str) -> dict[Precision, str | None]:
    """Precision -> None or the reason Transformer Engine cannot run it on ``device``."""
    cap = gpu_capability(device)
    if cap is None:
        return unavailable_table(NO_GPU_TE)
    error = te_import_error()
    if error is not None:
        return unavailable_table(error)
    return te_table(cap, cuda_version())


def torchao_support(device: torch.device | str) -> dict[Precision, str | None]:
    """Precision -> None or the reason the torchao backend cannot run it on ``device``."""
    error = torchao_import_error()
    table = torchao_table(gpu_capability(device))
    if error is None:
        return table
    return {p: (r if r is not None or not p.is_fp8 else error) for p, r in table.items()}


def require_te():
    """``transformer_engine.pytorch``, or :class:`BackendUnavailable` saying why it does not import."""
    error = te_import_error()
    if error is not None:
        raise BackendUnavailable(f"backend 'te': {error}")
    import transformer_engine.pytorch as te

    return te
