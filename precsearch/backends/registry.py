"""The numeric backends by name: the one list that ``get_backend``, the space file's ``backend`` and the CLI read.

Each entry builds its backend on demand and says why it cannot run here (its library does not
import), so choosing one backend never imports another's library. ``auto`` is not a backend: it
picks one for the device (:func:`precsearch.backends.get_backend`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from precsearch.backends.base import Backend
    from precsearch.backends.support import BackendSupport


@dataclass(frozen=True)
class BackendEntry:
    """One backend.

    Attributes:
        make: Builds the backend (imports its module, and its library, only when called).
        import_error: Why the backend's library does not import here; None when it does.
        support: What the backend runs on a CPU, answered as data without building it (no torch); None for
            a backend whose answers take a query of the machine (its library, its GPU).
    """

    make: Callable[[], Backend]
    import_error: Callable[[], str | None]
    support: Callable[[], BackendSupport] | None = None


def _emulated() -> Backend:
    from precsearch.backends.emulated import EmulatedBackend

    return EmulatedBackend()


def _emulated_support() -> BackendSupport:
    from precsearch.backends.support import EmulatedSupport

    return EmulatedSupport()


def _te() -> Backend:
    from precsearch.backends.te import TEBackend

    return TEBackend()


def _torchao() -> Backend:
    from precsearch.backends.torchao_backend import TorchaoBackend

    return TorchaoBackend()


def _te_import_error() -> str | None:
    from precsearch.backends.capability import te_import_error

    return te_import_error()


def _torchao_import_error() -> str | None:
    from precsearch.backends.capability import torchao_import_error

    return torchao_import_error()


BACKENDS: dict[str, BackendEntry] = {
    "emulated": BackendEntry(_emulated, lambda: None, _emulated_support),
    "te": BackendEntry(_te, _te_import_error),
    "torchao": BackendEntry(_torchao, _torchao_import_error),
}
"""Backend name -> entry."""

BACKEND_NAMES = tuple(BACKENDS)
AUTO = "auto"
#: What the space file's ``backend`` accepts: ``auto`` and every backend.
BACKEND_CHOICES = (AUTO, *BACKEND_NAMES)
