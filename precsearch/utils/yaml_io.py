"""Reading YAML files safely: the one place untrusted YAML is parsed (space and policy files).

:func:`load_yaml` reads plain data only (no Python tags), refuses duplicate keys, and bounds size,
depth and alias expansion, so a malformed or hostile file ends in a :class:`UserError`, never a
traceback, a hang or a blow-up. :func:`check_plain_data` applies the same checks to data that
did not come from a file.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

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


def _one_line(text: str) -> str:
    """Messages quote values from the file; a newline in one must not split the error over lines."""
    return text.replace("\r", "\\r").replace("\n", "\\n")
