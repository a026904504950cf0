"""The facts of each precision, in one table (:data:`SPECS`), read from the recipes.

Each precision's row lives in its module of :mod:`precsearch.recipes` (its
:attr:`~precsearch.recipes.base.Recipe.spec`); this module keeps the table view and the names that
consumers import from here. A framework that has no name for a precision holds None, and the recipe
says why not (``tests/recipes/test_contract.py`` runs each consumer over every recipe).
"""

from __future__ import annotations

from precsearch.precision import Precision
from precsearch.recipes.registry import RECIPES, recipe_for
from precsearch.recipes.spec import ADA, BLACKWELL, HOPPER, Capability, PrecisionSpec

SPECS: dict[Precision, PrecisionSpec] = {p: r.spec for p, r in RECIPES.items()}
"""Precision -> its facts; every :class:`~precsearch.precision.Precision` has a row."""


def spec_of(precision: Precision | str) -> PrecisionSpec:
    """The facts of ``precision`` (a :class:`~precsearch.precision.Precision` or its value)."""
    return recipe_for(precision).spec


__all__ = ["ADA", "BLACKWELL", "Capability", "HOPPER", "PrecisionSpec", "SPECS", "spec_of"]
