"""One probe model kept between the probes of a process, initialised again in place instead of rebuilt.

A study's probe process runs probe after probe of the same model shape: the BF16 references (one
per seed, per clipping value) and trials whose policies often give every layer the same recipe.
Building the model, converting it (a Transformer Engine stack is made module by module) and
freeing it again costs time on every probe that the steps do not need. :class:`ModelCache`
keeps the last model with what it was built for (:class:`BuildKey`); the next probe with the same
key gets it back with its weights drawn again from its own seed, exactly as a fresh build draws
them (:func:`precsearch.probe.model.llama3.apply_init`, same generator, same order), and its
converted layers reset by the backend (:meth:`precsearch.backends.base.Backend.reset_converted`).
Any other key, or a backend that cannot reset its layers, builds afresh, the old model freed
first so that a GPU's measured peak never holds two models.

A model is handed out by :meth:`ModelCache.take` and comes back only through
:meth:`ModelCache.keep` once its probe finished: a probe that raised leaves nothing cached.
``tests/probe/test_model_reuse.py`` checks that a reused model trains to the same losses, bit for
bit, as a fresh one, across a change of policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from precsearch.probe.model.llama3 import Llama3, apply_init


@dataclass(frozen=True)
class BuildKey:
    """What a built probe model depends on, besides its seed.

    Attributes:
        cfg: The probe's shape (a frozen ``ModelConfig``).
        device: Where it lives, as ``str(device)``.
        param_dtype: ``probe.param_dtype``.
        backend: The converting backend's name and the memory knobs it was chosen for.
        recipes: Each unit's recipe, in the order the backend converted them.
    """

    cfg: Any
    device: str
    param_dtype: str
    backend: tuple[str, str]
    recipes: tuple


@dataclass
class _Kept:
    key: BuildKey
    model: Llama3
    plan: list[tuple[torch.Tensor, str]]


class ModelCache:
    """The last probe model a process built, for the next probe with the same :class:`BuildKey`."""

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self._pending: _Kept | None = None  # handed out by take, not back yet
        self.reused = 0  # probes that got a kept model (read by tests and the bench)

    def take(self, key: BuildKey, seed: int, reset: Callable[[torch.nn.Module], bool],
             build: Callable[[], tuple[Llama3, list[tuple[torch.Tensor, str]]]]) -> Llama3:
        """The model for ``key`` initialised with ``seed``: the kept one re-initialised if ``key`` matches and
        ``reset`` (the backend's ``reset_converted``) succeeds, else ``build()``'s (model, init plan)."""
        kept, self._kept, self._pending = self._kept, None, None
        if kept is not None and kept.key == key:
            # seeded first, as build_probe seeds torch before converting: the emulated NVFP4 rounding
            # streams start from torch.initial_seed()
            torch.manual_seed(seed)
            if reset(kept.model):
                _reinitialise(kept, seed)
                self._pending = kept
                self.reused += 1
                return kept.model
        del kept  # freed before the build: never two models on the device at once
        model, plan = build()
        self._pending = _Kept(key, model, plan)
        return model

    def keep(self, model: Llama3) -> None:
        """Keep ``model`` (the one :meth:`take` last gave) for the next probe; its probe finished."""
        if self._pending is not None and self._pending.model is model:
            self._kept = self._pending
        self._pending = None


def _reinitialise(kept: _Kept, seed: int) -> None:
    """The kept model as a fresh build with ``seed`` leaves it: weights drawn again, no gradients, training mode."""
    model = kept.model
    apply_init(kept.plan, seed, next(model.parameters()).device)
    model.rotary_pos_emb.reset_inv_freq()
    for param in model.parameters():
        param.grad = None
    model.train()
