"""The precisions, one module each, behind :class:`Recipe` (:mod:`~precsearch.recipes.base`, whose docstring is
the contract), in one registry (:mod:`~precsearch.recipes.registry`).

Consumers ask the recipe of a precision (:func:`recipe_for`), never switch on its name. Base layer: names and
numbers only, no torch, nothing of the package above. Adding a precision: ``docs/recipes.md``.
"""

from precsearch.recipes.base import SETTINGS, Recipe
from precsearch.recipes.registry import (
    DEFAULT_PRECISION,
    RECIPES,
    STANDARD_FP8,
    STANDARD_FP8_NAME,
    all_recipes,
    low_recipes,
    readers,
    recipe_for,
    standard_fp8,
)
from precsearch.recipes.spec import ADA, BLACKWELL, HOPPER, Capability, PrecisionSpec

__all__ = ["ADA", "BLACKWELL", "Capability", "DEFAULT_PRECISION", "HOPPER", "PrecisionSpec", "RECIPES", "Recipe",
           "SETTINGS", "STANDARD_FP8", "STANDARD_FP8_NAME", "all_recipes", "low_recipes", "readers", "recipe_for",
           "standard_fp8"]
