"""A BF16 reference from a checkpoint start is not one from a random init: their cache keys must differ,
and a random-init space keeps the key it had before ``model.init_from`` existed (no ``init_from`` entry)."""

from __future__ import annotations

import torch

from _checkpoints import hf_llama, save_checkpoint
from _spaces import tiny_space_dict
from precsearch.config.space import Space
from precsearch.runtime.reference import reference_key

CPU = torch.device("cpu")


def test_checkpoint_start_and_pick_change_the_reference_key(tmp_path):
    path = save_checkpoint(hf_llama(), tmp_path)

    def space(**model) -> Space:
        d = tiny_space_dict()
        d["model"] = {"init_from": str(path), "probe_layers": 2, **model}
        return Space.model_validate(d)

    keys = {reference_key(space(), 1.0, CPU), reference_key(space(probe_layer_pick="last"), 1.0, CPU),
            reference_key(space(probe_layer_pick="spread"), 1.0, CPU)}
    assert len(keys) == 3  # first (0, 1), last (3, 4), spread (0, 4): three different probes


def test_random_init_key_has_no_checkpoint_entry(monkeypatch):
    seen = {}
    import json

    real = json.dumps
    monkeypatch.setattr(json, "dumps", lambda obj, **kw: seen.setdefault("payload", obj) and real(obj, **kw))
    reference_key(Space.model_validate(tiny_space_dict()), 1.0, CPU)
    assert "init_from" not in seen["payload"]
