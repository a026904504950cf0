"""Reading space files: YAML -> :class:`Space`, with errors that name file and field.

The YAML itself is read by :func:`precsearch.utils.yaml_io.load_yaml` (also used for policy files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.utils.validation import user_error
from precsearch.utils.yaml_io import check_plain_data, load_yaml


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
        raise user_error(exc, Space, file) from None
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
