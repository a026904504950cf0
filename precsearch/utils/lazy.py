"""A package's public names, re-exported from its modules without importing them until first use.

A package's ``__init__`` lists its public API in ``__all__``; where importing a name would import what
the package's own import does not need (torch, Optuna, MLflow, or just every module of the package),
the name is re-exported lazily: :func:`lazy_exports` gives the module ``__getattr__`` (PEP 562) that
imports the defining module when the name is first asked for. ``from precsearch.search import score``
then costs what ``from precsearch.search.scoring import score`` did.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` that serves each ``name`` of ``where`` from its module.

    Args:
        package: The package's dotted name (``__name__`` in its ``__init__``).
        where: Public name -> the module of ``package`` that defines it, relative (``"scoring"``).
    """

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
