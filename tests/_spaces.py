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


def per_module_policy(n_layers: int, seed: int, precisions: tuple[str, ...]):
    """The policy of one trial of a per-module space over ``n_layers`` blocks (every unit and the head its
    own precision, drawn from ``precisions`` with ``seed``), built the way ``precsearch run`` builds it."""
    import random

    from precsearch.config.loader import parse_space
    from precsearch.config.unit_space import searched_units
    from precsearch.search.sampling import policy_from_params

    data = tiny_space_dict(**{"model.n_layers": n_layers, "search.warmup_steps": 0,
                              "search.units": [{"precision": {"choices": list(precisions)}},
                                               {"modules": ["output_layer"],
                                                "precision": {"choices": list(precisions)}}]})
    data["search"].pop("groups")
    space = parse_space(data)
    rng = random.Random(seed)
    params = {u.param: rng.choice(precisions) for u in searched_units(space.search.units, n_layers)}
    return policy_from_params(space, params)
