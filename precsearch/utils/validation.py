"""pydantic validation errors as :class:`UserError`: the file, the dotted field, one line."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from precsearch.errors import UserError
from precsearch.utils.yaml_io import _one_line


def user_error(exc: ValidationError, model: type[BaseModel], file: str, prefix: str = "") -> UserError:
    """The first problem of a pydantic validation of ``model`` as a :class:`UserError` naming ``file`` and the field.

    The field is dotted (``search.groups[2].precision``); an unknown key lists the valid ones; ``prefix``
    starts the message (e.g. ``"malformed policy: "``).
    """
    # a misspelt key shows up twice (unknown key, required field missing): the unknown key is the cause
    err = min(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    loc = err["loc"]
    field = _dotted(loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        valid = _valid_keys(model, loc[:-1])
        msg = f"unknown key '{loc[-1]}'" + (f"; valid keys: {', '.join(valid)}" if valid else "")
    elif err["type"] == "missing":
        msg = "this field is required"
    more = len(exc.errors()) - 1
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return UserError(_one_line(prefix + msg), file=file, field=_one_line(field))


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith("function-"):
            out += ("." if out else "") + str(part)
    return out


def _valid_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
