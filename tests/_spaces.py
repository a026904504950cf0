"""Small spaces that run in seconds on 2 CPU cores (imported by tests)."""

from __future__ import annotations

from pathlib import Path

import yaml


SMOKE = Path(__file__).resolve().parents[1] / "search_spaces" / "cpu_smoke.yaml"


def tiny_space_dict(**overrides) -> dict:
    """``search_spaces/cpu_smoke.yaml`` as data (study "tiny"), with dotted-key overrides."""
    space = yaml.safe_load(SMOKE.read_text())
    space["study"]["name"] = "tiny"
    for dotted, value in overrides.items():
        node = space
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return space


def write_space(tmp_path: Path, data: dict | str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path
