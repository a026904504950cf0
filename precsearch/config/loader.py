"""Reading space files: YAML -> :class:`Space`, with errors that name file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from precsearch.config.space import Space
from precsearch.errors import UserError


def load_yaml(path: Path) -> Any:
    """Parse a YAML file safely; syntax errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise UserError("file not found", file=str(path))
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"YAML syntax error: {where}{problem}", file=str(path)) from None
    except UnicodeDecodeError:
        raise UserError("not a UTF-8 text file", file=str(path)) from None


def parse_space(data: Any, *, file: str = "<space>", base_dir: Path | None = None) -> Space:
    """Validate plain data as a :class:`Space`; relative data paths resolve against ``base_dir``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping of sections, got {type(data).__name__}", file=file)
    try:
        space = Space.model_validate(data)
    except ValidationError as exc:
        raise _user_error(exc, file) from None
    return _resolve_paths(space, base_dir) if base_dir else space


def load_space(path: Path) -> Space:
    """Load and validate a space file (cross-field checks are in :mod:`.checks`)."""
    path = Path(path)
    return parse_space(load_yaml(path), file=str(path), base_dir=path.resolve().parent)


def _resolve_paths(space: Space, base: Path) -> Space:
    data = space.data
    updates = {
        key: (base / value) for key in ("path", "tokenizer")
        if (value := getattr(data, key)) is not None and not value.is_absolute()
    }
    if not updates:
        return space
    return space.model_copy(update={"data": data.model_copy(update=updates)})


def _user_error(exc: ValidationError, file: str) -> UserError:
    err = exc.errors()[0]
    loc = err["loc"]
    field = _dotted(loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        valid = _valid_keys(Space, loc[:-1])
        msg = f"unknown key '{loc[-1]}'" + (f"; valid keys: {', '.join(valid)}" if valid else "")
    elif err["type"] == "missing":
        msg = "this field is required"
    more = len(exc.errors()) - 1
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return UserError(msg, file=file, field=field)


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
