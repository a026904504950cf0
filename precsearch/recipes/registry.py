"""The recipes by precision: the one list every consumer reads.

A new precision is a member of :class:`~precsearch.precision.Precision`, a module here with its
:class:`~precsearch.recipes.base.Recipe`, and a row in :data:`RECIPES`; ``tests/recipes/test_contract.py``
then runs every consumer over it, and ``tests/recipes/test_no_precision_names.py`` fails on a module outside
``precsearch/recipes/`` that names it.
"""

from __future__ import annotations

from collections.abc import Callable

from precsearch.precision import Precision
from precsearch.recipes.base import Recipe
from precsearch.recipes.bf16 import BF16
from precsearch.recipes.fp8_block import FP8Block
from precsearch.recipes.fp8_current import FP8Current
from precsearch.recipes.fp8_delayed import FP8Delayed
from precsearch.recipes.fp8_rowwise import FP8Rowwise
from precsearch.recipes.mxfp8 import MXFP8
from precsearch.recipes.nvfp4 import NVFP4

RECIPES: dict[Precision, Recipe] = {r.precision: r for r in (
    BF16(), FP8Delayed(), FP8Current(), FP8Block(), MXFP8(), NVFP4(), FP8Rowwise())}
"""Precision -> its recipe, in the enum's order (ties between precisions go to the earlier one)."""

#: The precision a layer no rule makes low runs: the reference.
DEFAULT_PRECISION: Precision = next(p for p in RECIPES if not p.is_fp8)


#: The standard FP8 recipe a trial's stability is set beside (``objectives.damage.standard_reference``): Megatron-Core's
#: default, delayed scaling, first; then what stands in for it on a backend or device that cannot run it.
STANDARD_FP8: tuple[Precision, ...] = (FP8Delayed.precision, FP8Current.precision)
#: What every output calls it (with the recipe it ran, and the optimizer state, in words beside).
STANDARD_FP8_NAME = "the standard FP8 recipe"


def standard_fp8(runs: Callable[[Precision], bool]) -> Recipe | None:
    """The standard FP8 recipe (:data:`STANDARD_FP8`) that ``runs`` (is it runnable here?) accepts first; None if
    none is: then nothing is set beside a trial."""
    return next((RECIPES[p] for p in STANDARD_FP8 if runs(p)), None)


def recipe_for(precision: Precision | str) -> Recipe:
    """The recipe of ``precision`` (a member or its value); ValueError naming the valid ones otherwise."""
    try:
        return RECIPES[Precision(precision)]
    except ValueError:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(p.value for p in RECIPES)}") from None


def all_recipes() -> tuple[Recipe, ...]:
    """Every registered recipe, BF16 first."""
    return tuple(RECIPES.values())


def low_recipes() -> tuple[Recipe, ...]:
    """Every recipe that quantizes (all but BF16)."""
    return tuple(r for r in RECIPES.values() if r.low)


def readers(setting: str) -> frozenset[Precision]:
    """The precisions whose recipe reads the :class:`~precsearch.precision.LayerRecipe` field ``setting``."""
    return frozenset(p for p, r in RECIPES.items() if setting in r.settings)
