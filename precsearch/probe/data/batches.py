"""Cutting a token stream into deterministic training batches and a fixed held-out set."""

from __future__ import annotations

import numpy as np
import torch

from precsearch.probe.data.split import HELD_OUT_FRACTION, held_out_start  # noqa: F401 - re-exported


def _check_batch_args(tokens: torch.Tensor, **sizes: int) -> None:
    """Programming errors (the config schema already bounds these), hence ValueError."""
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    for name, value in sizes.items():
        least = 1 if name in ("seq_len", "micro_batch", "grad_accum") else 0
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")


class TokenBatches:
    """Deterministic training batches and a fixed held-out set from one token stream.

    The end of the stream is held out: ``HELD_OUT_FRACTION`` of it, and at least
    ``eval_batches * micro_batch * seq_len + 1`` tokens. Training windows are drawn
    only from the tokens before it, so the two never overlap. A step of ``grad_accum``
    micro-batches draws all its windows at once and hands them out ``micro_batch`` at a time. The held-out windows
    are spread evenly over the held-out part (not packed at its start) so that the
    loss gap is measured on varied text, not on one file. They depend only on the
    stream, not on ``seed``, so every trial is scored on the same tokens.
    """

    def __init__(
        self, tokens: torch.Tensor, *, seq_len: int, micro_batch: int, seed: int, eval_batches: int = 4,
        grad_accum: int = 1,
    ):
        _check_batch_args(tokens, seq_len=seq_len, micro_batch=micro_batch, seed=seed, eval_batches=eval_batches,
                          grad_accum=grad_accum)
        self.seq_len, self.micro_batch, self.grad_accum = seq_len, micro_batch, grad_accum
        self.seed, self.eval_batches = seed, eval_batches
        #: Index of the first held-out token; training windows end before it.
        self.eval_start = held_out_start(tokens.numel(), seq_len=seq_len, micro_batch=micro_batch,
                                         eval_batches=eval_batches)
        self.tokens = tokens.long()
        self._eval: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def with_seed(self, seed: int) -> "TokenBatches":
        """The same stream and held-out set with the training windows drawn from ``seed`` (tokens shared)."""
        other = object.__new__(TokenBatches)
        other.__dict__.update(self.__dict__, seed=seed)
        return other

    @property
    def max_offset(self) -> int:
        """Largest start index of a training window."""
        return self.eval_start - self.seq_len - 1

    def train_offsets(self, step: int) -> torch.Tensor:
        """Start indices of the ``micro_batch x grad_accum`` windows of ``step`` (a function of seed and step).

        One draw per step, cut into micro-batches in order: with ``grad_accum`` 1 it is the draw a
        probe made before accumulation existed, so those runs see the same windows.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        # SeedSequence mixes (seed, step) so nearby seeds and steps give unrelated draws.
        mixed = int(np.random.SeedSequence([self.seed, step]).generate_state(1, dtype=np.uint64)[0])
        gen = torch.Generator().manual_seed(mixed)
        return torch.randint(0, self.max_offset + 1, (self.micro_batch * self.grad_accum,), generator=gen)

    def train_batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``micro`` of ``step`` as ``(inputs, targets)``, each ``(micro_batch, seq_len)`` int64;
        targets are inputs shifted by one."""
        if not 0 <= micro < self.grad_accum:
            raise ValueError(f"micro must lie in [0, {self.grad_accum}), got {micro}")
        rows = self.train_offsets(step)[micro * self.micro_batch:(micro + 1) * self.micro_batch]
        return self._windows(rows)

    def eval_set(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``eval_batches`` held-out ``(inputs, targets)`` batches, spread over the held-out tail."""
        if self._eval is None and self.eval_batches == 0:
            self._eval = []  # split() of empty tensors would give one empty batch
        if self._eval is None:
            n_windows = self.eval_batches * self.micro_batch
            last = self.tokens.numel() - self.seq_len - 1
            offsets = torch.linspace(self.eval_start, last, n_windows).long()
            inputs, targets = self._windows(offsets)
            self._eval = list(
                zip(inputs.split(self.micro_batch), targets.split(self.micro_batch), strict=True)
            )
        return self._eval

    def _windows(self, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = offsets[:, None] + torch.arange(self.seq_len + 1)
        windows = self.tokens[index]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
