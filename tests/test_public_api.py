"""Each package's ``__init__`` names its public API: a docstring and an ``__all__`` whose names all resolve.

What would be wrong if these failed: a package whose reader cannot tell, from its ``__init__``, what other
packages may use; or an ``__all__`` (or a lazy re-export of :func:`precsearch.utils.lazy.lazy_exports`)
naming something that is not there, so ``from precsearch.search import *`` or a documented import breaks.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from precsearch.utils.lazy import lazy_exports

PACKAGE = Path(__file__).resolve().parents[1] / "precsearch"
PACKAGES = sorted(".".join(path.parent.relative_to(PACKAGE.parent).parts) for path in PACKAGE.rglob("__init__.py"))


def test_every_package_is_listed():
    assert len(PACKAGES) >= 18 and {"precsearch", "precsearch.config", "precsearch.probe.data"} <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_documents_and_lists_its_public_names(name):
    package = importlib.import_module(name)
    assert (package.__doc__ or "").strip(), f"{name}/__init__.py has no docstring"
    assert isinstance(getattr(package, "__all__", None), list) and package.__all__, f"{name} has no __all__"
    assert len(set(package.__all__)) == len(package.__all__), f"{name}.__all__ repeats a name"
    missing = [n for n in package.__all__ if not hasattr(package, n)]
    assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def test_a_lazy_export_is_the_defining_modules_object_and_refuses_unknown_names():
    from precsearch import search
    from precsearch.search import scoring

    assert search.score is scoring.score
    with pytest.raises(AttributeError, match="no_such_name"):
        search.no_such_name  # noqa: B018
    getattr_ = lazy_exports("precsearch.utils", {"load_yaml": "yaml_io"})
    assert getattr_("load_yaml") is importlib.import_module("precsearch.utils.yaml_io").load_yaml
    assert not hasattr(importlib.import_module("precsearch.config"), "not_exported")
