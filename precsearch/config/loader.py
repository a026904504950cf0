"""Reading space files: YAML -> :class:`Space`, with errors that name file and field.

The YAML itself is read by :func:`precsearch.utils.yaml_io.load_yaml` (also used for policy files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.utils.yaml_io import _one_line, check_plain_data, load_yaml


def parse_space(data: Any, *, file: str = "<space>", base_dir: Path | None = None) -> Space:
    """Validate plain data as a :class:`Space`; relative data paths resolve against ``base_dir``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping of sections, got {type(data).__name__}", file=file)
    check_plain_data(data, file=file)
    try:
        space = Space.model_validate(data)
    except ValidationError as exc:
        raise _user_error(exc, file) from None
    return _resolve_paths(space, base_dir) if base_dir else space


def load_space(path: Path) -> Space:
    """Load and validate a space file (cross-field checks are in :mod:`.checks`)."""
    path = Path(path)
    data = load_yaml(path)
    if data is None:
        raise UserError("the file is empty (or only comments); a space file has sections such as model, probe, "
                        "search, study", file=str(path))
    return parse_space(data, file=str(path), base_dir=path.resolve().parent)


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
    # a misspelt key shows up twice (unknown key, required field missing): the unknown key is the cause
    err = min(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
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
    return UserError(_one_line(msg), file=file, field=_one_line(field))



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
