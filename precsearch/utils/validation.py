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
    elif err["type"] in _RANGE_ERRORS:
        msg = f"{msg} (got {err['input']!r}){_valid_range(model, loc)}"
    more = len(exc.errors()) - 1
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return UserError(_one_line(prefix + msg), file=file, field=_one_line(field))


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _valid_range(model: type[BaseModel], loc: tuple) -> str:
    """``; valid: 0 to 4294967295`` from the bounds the field at ``loc`` declares, or "" if none are found."""
    field = _field_at(model, loc)
    if field is None:
        return ""
    bounds = {type(m).__name__.lower(): getattr(m, type(m).__name__.lower()) for m in field.metadata
              if type(m).__name__ in ("Gt", "Ge", "Lt", "Le")}
    low = f"> {bounds['gt']}" if "gt" in bounds else f">= {bounds['ge']}" if "ge" in bounds else None
    high = f"< {bounds['lt']}" if "lt" in bounds else f"<= {bounds['le']}" if "le" in bounds else None
    if "ge" in bounds and "le" in bounds:
        return f"; valid: {bounds['ge']} to {bounds['le']}"
    return f"; valid: {' and '.join(b for b in (low, high) if b)}" if low or high else ""


def _field_at(model: type[BaseModel], loc: tuple) -> Any:
    """The pydantic FieldInfo at ``loc`` (list indices skipped), or None."""
    current: Any = model
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part) if current is not None else None
        if field is None:
            return None
        current = _model_in(field.annotation)
    return field


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
