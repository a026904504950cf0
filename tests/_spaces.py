"""Small spaces that run in seconds on 2 CPU cores (imported by tests)."""

from __future__ import annotations

from pathlib import Path

import yaml


def tiny_space_dict(**overrides) -> dict:
    """A space whose study runs in a few seconds: a 2-layer, 64-wide probe for 12 steps."""
    space = {
        "model": {"preset": "tiny", "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "n_layers": 2},
        "data": {"source": "stdlib", "max_tokens": 200_000, "eval_batches": 2},
        "probe": {"steps": 12, "micro_batch": 4, "seq_len": 32, "lr": 3e-3, "device": "cpu", "lr_warmup_steps": 2},
        "backend": "emulated",
        "search": {
            "groups": [
                {"name": "attention", "modules": ["*.self_attn.*"],
                 "precision": {"choices": ["bf16", "fp8_current", "fp8_delayed"]}},
                {"name": "mlp", "modules": ["*.mlp.*"], "precision": {"choices": ["bf16", "fp8_block"]}},
            ],
            "warmup_steps": {"choices": [0, 4]},
            "clip_grad": 1.0,
        },
        "study": {"name": "tiny", "n_trials": 4, "sampler": "random", "seed": 1},
    }
    for dotted, value in overrides.items():
        node = space
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return space


def write_space(tmp_path: Path, data: dict | str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path
