"""Where a token stream's held-out tail starts: arithmetic on the stream's length, no tensors.

:class:`~precsearch.probe.data.batches.TokenBatches` cuts its batches at this point, and
:func:`~precsearch.probe.data.sources.check_data` checks a space's stream against it without building them
(so ``precsearch validate`` needs no torch).
"""

from __future__ import annotations

from precsearch.errors import DataError

#: Share of the stream held out for evaluation (when it exceeds what the eval batches need).
HELD_OUT_FRACTION = 0.05


def held_out_start(n_tokens: int, *, seq_len: int, micro_batch: int, eval_batches: int) -> int:
    """Index of the first held-out token of a stream of ``n_tokens``: the tail is ``HELD_OUT_FRACTION`` of it,
    and at least ``eval_batches * micro_batch * seq_len + 1`` tokens (none without eval batches).

    Raises:
        DataError: the stream leaves fewer than ``seq_len + 1`` tokens before the tail for training.
    """
    need = eval_batches * micro_batch * seq_len + 1 if eval_batches else 0
    tail = max(need, int(HELD_OUT_FRACTION * n_tokens)) if eval_batches else 0
    start = n_tokens - tail
    if start < seq_len + 1:
        raise DataError(
            f"{n_tokens} tokens are too few: need seq_len + 1 = {seq_len + 1} for training "
            f"plus {tail} held out ({eval_batches} eval batches of {micro_batch} x {seq_len})",
            field="data",
        )
    return start
