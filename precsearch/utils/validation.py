"""pydantic validation errors as :class:`UserError`: the file, the dotted field, one line per problem."""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from precsearch.errors import UserError, UserErrors
from precsearch.utils.yaml_io import _one_line


def user_error(exc: ValidationError, model: type[BaseModel], file: str, prefix: str = "") -> UserError:
    """Every problem of a pydantic validation of ``model`` as a :class:`UserError` naming ``file`` and the field.

    One problem gives a :class:`UserError`, several a :class:`UserErrors` (one line each). The field is
    dotted (``search.groups[2].precision``); each line names the bad value, and for a name (a key, an
    enum member) the valid ones and the closest to what was written; ``prefix`` starts each message
    (e.g. ``"malformed policy: "``).
    """
    errors = _causes(exc.errors())
    problems = [UserError(_one_line(prefix + _message(err, model)), file=file, field=_one_line(_dotted(err["loc"])))
                for err in errors]
    return problems[0] if len(problems) == 1 else UserErrors(problems)


def _causes(errors: list[dict]) -> list[dict]:
    """The errors less a required field reported missing beside an unknown key that is its misspelling
    (``stepz`` for ``steps``): the unknown key is the cause, listed once."""
    misspelt = {(tuple(e["loc"][:-1]), str(e["loc"][-1])) for e in errors if e["type"] == "extra_forbidden"}

    def explained(err: dict) -> bool:
        parent, name = tuple(err["loc"][:-1]), str(err["loc"][-1])
        return any(p == parent and closest(key, [name]) for p, key in misspelt)

    return [e for e in errors if not (e["type"] == "missing" and explained(e))]


def _message(err: dict, model: type[BaseModel]) -> str:
    """One problem's message: what is wrong, the value written, what would be valid."""
    loc, kind = err["loc"], err["type"]
    if kind == "extra_forbidden":
        valid = _valid_keys(model, loc[:-1])
        if not valid:
            return f"unknown key '{loc[-1]}'"
        return f"unknown key '{loc[-1]}'{_did_you_mean(str(loc[-1]), valid)} valid keys: {', '.join(valid)}"
    if kind == "missing":
        return "this field is required"
    msg = err["msg"].removeprefix("Value error, ")
    valid = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
    if kind in _CHOICE_ERRORS and isinstance(err.get("input"), str) and valid:
        return f"unknown value {err['input']!r}{_did_you_mean(err['input'], valid)} valid: {', '.join(valid)}"
    if kind in _RANGE_ERRORS:
        return f"{msg} (got {err['input']!r}){_valid_range(model, loc)}"
    value = err.get("input")
    if isinstance(value, (str, int, float, bool)) and repr(value) not in msg and str(value) not in msg:
        msg += f" (got {value!r})"
    return msg


def closest(value: str, valid: list[str]) -> str | None:
    """The valid name nearest to ``value`` (a misspelling of it), or None when none is near."""
    found = difflib.get_close_matches(value, valid, n=1, cutoff=0.6)
    return found[0] if found else None


def _did_you_mean(value: str, valid: list[str]) -> str:
    """``; did you mean 'steps'?`` (or ``;`` alone when nothing valid is near), before the valid names."""
    near = closest(value, valid)
    return f"; did you mean {near!r}?" if near else ";"


_CHOICE_ERRORS = {"enum", "literal_error"}
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
