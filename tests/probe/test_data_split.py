"""``check_data`` (numpy, no torch) refuses exactly the streams ``load_batches`` (tensors) cannot cut.

If this fails, ``precsearch validate`` and the probe disagree on the held-out split: a space would pass
validation and then fail in every probe process, or be refused for data a probe could train on.
"""

from __future__ import annotations

import numpy as np
import pytest
from _spaces import tiny_space_dict

from precsearch.config.space import Space
from precsearch.errors import DataError
from precsearch.probe.data import check_data, load_batches
from precsearch.probe.data.split import held_out_start


def _space(tmp_path, n_tokens: int) -> Space:
    path = tmp_path / f"t{n_tokens}.npy"
    np.save(path, np.arange(n_tokens, dtype=np.int64) % 200)
    data = {"source": "tokens", "path": str(path), "eval_batches": 2}
    return Space.model_validate(tiny_space_dict(data=data, **{"probe.seq_len": 32, "probe.micro_batch": 4}))


def test_the_split_is_the_batches_split(tmp_path):
    space = _space(tmp_path, 5000)
    batches = load_batches(space)
    assert batches.eval_start == held_out_start(5000, seq_len=32, micro_batch=4, eval_batches=2)


@pytest.mark.parametrize("n_tokens", [2 * 4 * 32 + 1 + 32, 2 * 4 * 32 + 1 + 33, 2 * 4 * 32 + 1 + 34, 400])
def test_check_data_refuses_what_load_batches_refuses(tmp_path, n_tokens):
    """Around the shortest stream the split allows (eval tail 2 x 4 x 32 + 1, then seq_len + 1 to train)."""
    space = _space(tmp_path, n_tokens)
    outcomes = []
    for check in (check_data, load_batches):
        try:
            check(space)
            outcomes.append(None)
        except DataError as exc:
            outcomes.append((exc.field, str(exc)))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] is None) == (n_tokens >= 2 * 4 * 32 + 1 + 33)
