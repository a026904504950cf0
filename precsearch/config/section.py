"""The base of every space-file section, and the one rule for its numbers (:mod:`precsearch.utils.numbers`)."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from precsearch.utils.numbers import number_problem


class Section(BaseModel):
    """Base for every section: unknown keys are errors, values are checked on assignment.

    Every field whose type holds a number (``int``, ``float``, optional, or in a list or tuple) refuses
    a bool before pydantic would read it as 0 or 1, and a float that is not finite after parsing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if takes_number(cls.model_fields[info.field_name].annotation):
            _refuse(value, lambda v: isinstance(v, bool))
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        if takes_number(cls.model_fields[info.field_name].annotation):
            _refuse(value, lambda v: number_problem(v) is not None)
        return value


def takes_number(annotation: Any) -> bool:
    """Whether a field of this type holds numbers (``int``/``float``, bare or inside Optional, list, tuple)."""
    if annotation in (int, float):
        return True
    return any(takes_number(arg) for arg in typing.get_args(annotation))


def _refuse(value: Any, bad) -> None:
    for item in value if isinstance(value, (list, tuple)) else (value,):
        if bad(item):
            raise ValueError(number_problem(item))
