"""Reading space files: YAML -> :class:`Space`, with errors that name file and field.

:func:`load_yaml` is also how policy files are read, and is the one place untrusted YAML is parsed:
plain data only (no Python tags), no duplicate keys, and bounded in size, depth and alias expansion,
so a malformed or hostile file ends in a :class:`UserError`, never a traceback, a hang or a blow-up.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from precsearch.config.space import Space
from precsearch.errors import UserError

MAX_FILE_BYTES = 1 << 20  # space and policy files are a few KiB; anything this big is the wrong file
MAX_VALUES = 100_000  # after expanding aliases: stops an alias bomb ("billion laughs") from exhausting memory
MAX_DEPTH = 64  # also catches a list or mapping that contains itself through an alias
MAX_INT = 2**63 - 1  # every integer setting ends up in a 64-bit counter, seed or size


def load_yaml(path: Path) -> Any:
    """Parse a YAML file safely into plain data (mappings, lists, strings, numbers, booleans, null).

    Python tags (``!!python/object``) and other custom tags are refused, duplicate keys are errors,
    and files over :data:`MAX_FILE_BYTES` or that expand (through aliases) to more than
    :data:`MAX_VALUES` values or :data:`MAX_DEPTH` levels are refused before anything uses them.

    Raises:
        UserError: naming the file, and the line or field, of the first problem.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError("file not found", file=str(path))
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UserError(f"file is {size} bytes; a space or policy file is at most {MAX_FILE_BYTES} bytes",
                        file=str(path))
    try:
        data = yaml.load(path.read_bytes().decode("utf-8"), Loader=_StrictLoader)  # _StrictLoader is a SafeLoader
    except UnicodeDecodeError:
        raise UserError("not a UTF-8 text file", file=str(path)) from None
    except yaml.YAMLError as exc:
        raise UserError(_one_line(_yaml_problem(exc)), file=str(path)) from None
    except RecursionError:
        raise UserError(f"nested more than {MAX_DEPTH} levels deep", file=str(path)) from None
    except (ValueError, LookupError, AttributeError, TypeError, OverflowError) as exc:
        # PyYAML builds lists, sets and mappings in resumable steps, outside construct_object's guard
        raise UserError(_one_line(f"YAML value cannot be read: {str(exc)[:200]}"), file=str(path)) from None
    check_plain_data(data, file=str(path))
    return data


def check_plain_data(data: Any, *, file: str) -> None:
    """Refuse data no setting can mean: too large or deep, self-referencing, NaN/inf, oversized integers.

    Shared (aliased) subtrees are counted once per use, as a consumer would see them, but each is
    walked only once, so an alias bomb is measured in linear time.
    """
    _Walk(file).size(data, "", 0)


class _Walk:
    """One pass over loaded data; ``sizes`` remembers each shared list or mapping already counted."""

    def __init__(self, file: str):
        self.file = file
        self.sizes: dict[int, int] = {}

    def size(self, node: Any, field: str, depth: int) -> int:
        if depth > MAX_DEPTH:
            where = field if len(field) <= 60 else f"{field[:60]}…"
            raise UserError(f"nested more than {MAX_DEPTH} levels deep (or refers to itself through an alias)",
                            file=self.file, field=where or None)
        if isinstance(node, (dict, list)):
            count = self.sizes.get(id(node))
            if count is None:
                count = 1 + sum(self.size(v, f, depth + 1) for f, v in _children(node, field))
                self.sizes[id(node)] = count
        else:
            _check_scalar(node, self.file, field)
            count = 1
        if count > MAX_VALUES:
            raise UserError(f"expands to more than {MAX_VALUES} values (aliases included); "
                            "a space or policy file is far smaller", file=self.file, field=field or None)
        return count


def _children(node: dict | list, field: str):
    if isinstance(node, list):
        return ((f"{field}[{i}]", v) for i, v in enumerate(node))
    return ((_one_line(f"{field}.{k}" if field else str(k)), v) for k, v in node.items())


def _check_scalar(value: Any, file: str, field: str) -> None:
    if value is not None and not isinstance(value, (str, int, float)):  # bool is an int
        raise UserError(f"{_shown(value)} is read as a {type(value).__name__} (a date or a tagged value); settings "
                        f"are strings, numbers, booleans, lists and mappings: quote it if you mean text",
                        file=file, field=field or None)
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{value} is not a usable number here; give a finite value", file=file, field=field or None)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise UserError(f"{_shown(value)} is too large; integers must lie within ±{MAX_INT}",
                        file=file, field=field or None)


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(text)} characters)"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys (the last one silently winning hides mistakes).

    A scalar the safe constructors cannot convert (``!!int abc``, a 13th month, an integer of
    5000 digits) raises plain Python errors inside PyYAML; they become YAML errors at that node.
    """

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, LookupError, AttributeError, TypeError, OverflowError) as exc:
            text = str(node.value) if isinstance(node, yaml.ScalarNode) else node.tag
            shown = text if len(text) <= 40 else f"{text[:40]}…"
            reason = str(exc).split(";")[0][:120]
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {shown!r} as {tag}: {reason}",
                                                    node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)  # raises PyYAML's "expected a mapping node"
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *defaults' may be overridden by the mapping's own keys
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key '{key}' (each key may appear once)", key_node.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character #x{exc.character:04x} at position {exc.position} is not allowed in YAML text"
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).replace("\n", " ")
    if problem.startswith("could not determine a constructor for the tag"):
        tag = problem.rsplit(" ", 1)[-1].strip("'").replace("tag:yaml.org,2002:", "!!")
        return f"{where}tag {tag} is not allowed; only plain YAML data (mappings, lists, strings, numbers)"
    if isinstance(exc, yaml.constructor.ConstructorError):  # well-formed YAML, but a value or key we refuse
        return f"{where}{problem}"
    if "\\t" in problem:
        problem += " (indent with spaces, not tabs)"
    return f"YAML syntax error: {where}{problem}"


def parse_space(data: Any, *, file: str = "<space>", base_dir: Path | None = None) -> Space:
    """Validate plain data as a :class:`Space`; relative data paths and ``model.init_from`` resolve against
    ``base_dir``."""
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
    model = space.model
    if model.init_from is not None and not model.init_from.is_absolute():
        space = space.model_copy(update={"model": model.model_copy(update={"init_from": base / model.init_from})})
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


def _one_line(text: str) -> str:
    """Messages quote values from the file; a newline in one must not split the error over lines."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


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
