"""One probe model kept between the probes of a process, initialised again in place instead of rebuilt.

A study's probe process runs probe after probe of the same model shape: the BF16 references (one
per seed, per clipping value) and trials whose policies often give every layer the same recipe.
Building the model, converting it (a Transformer Engine stack is made module by module) and
freeing it again costs time on every probe that the steps do not need. :class:`ModelCache`
keeps the last model with what it was built for (:class:`BuildKey`); the next probe with the same
key gets it back with its weights drawn again from its own seed, exactly as a fresh build draws
them (:func:`precsearch.probe.model.llama3.apply_init`, same generator, same order), and its
converted layers reset by the backend (:meth:`precsearch.backends.base.Backend.reset_converted`).
A probe that starts from given weights instead of a seed (the fixed-state reading's model at a state of
the BF16 run, :mod:`precsearch.probe.damage.states`) gets the kept model with those weights copied in,
as a fresh build loads them. Any other key, or a backend that cannot reset its layers, builds afresh,
the old model freed first so that a GPU's measured peak never holds two models.

The weights are set through the model's *plain view* (:meth:`precsearch.backends.base.Backend.plain_tensors`):
each Parameter name of the plain probe mapped to the tensor of the converted model that holds its values,
the plain Parameters themselves for a backend that keeps them, Transformer Engine's for the TE stack.

A model is handed out by :meth:`ModelCache.take` and comes back only through
:meth:`ModelCache.keep` once its probe finished: a probe that raised leaves nothing cached.
``tests/probe/model/test_model_reuse.py`` checks that a reused model trains to the same losses, bit for
bit, as a fresh one, across a change of policy and from given weights; ``tests/backends/test_gpu_te_reuse.py``
does for the TE stack on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from precsearch.probe.model.llama3 import Llama3, apply_init, init_plan


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
    plan: list[tuple[str, str]]  # (plain Parameter name, "normal" | "ones"), in init order
    plain: dict[str, torch.Tensor]  # plain Parameter name -> the converted model's tensor holding it


class Resets(Protocol):
    """What the cache needs of a backend (:class:`precsearch.backends.base.Backend` has both)."""

    resets_converted: bool

    def reset_converted(self, model: torch.nn.Module) -> bool: ...


#: What a build hands the cache: the converted model, its init plan by plain name, and its plain view.
Built = tuple[Llama3, list[tuple[str, str]], dict[str, torch.Tensor]]


class ModelCache:
    """The last probe model a process built, for the next probe with the same :class:`BuildKey`."""

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self._pending: _Kept | None = None  # handed out by take, not back yet
        self.reused = 0  # probes that got a kept model (read by tests and the bench)

    def take(self, key: BuildKey, seed: int, backend: Resets, build: Callable[[], Built],
             weights: Mapping[str, torch.Tensor] | None = None) -> Llama3:
        """The model for ``key`` initialised with ``seed`` (or holding ``weights``, a plain ``state_dict``): the
        kept one set again if ``key`` matches and the backend's ``reset_converted`` succeeds, else ``build()``'s
        (model, init plan, plain view). A backend that cannot reset its layers (``resets_converted`` false) gets
        its model built and never kept: it would only hold (device) memory."""
        kept, self._kept, self._pending = self._kept, None, None
        if kept is not None and kept.key == key:
            # seeded first, as build_probe seeds torch before converting: the emulated NVFP4 rounding
            # streams start from torch.initial_seed()
            torch.manual_seed(seed)
            if backend.reset_converted(kept.model):
                if weights is None:
                    _reinitialise(kept, seed)
                else:
                    _load(kept, weights)
                self._pending = kept
                self.reused += 1
                return kept.model
        del kept  # freed before the build: never two models on the device at once
        model, plan, plain = build()
        self._pending = _Kept(key, model, plan, plain) if backend.resets_converted else None
        return model

    def clear(self) -> None:
        """Free the kept model (before work that needs its device memory and cannot take it)."""
        self._kept = None

    def keep(self, model: Llama3) -> None:
        """Keep ``model`` (the one :meth:`take` last gave) for the next probe; its probe finished. A model the cache
        did not hand out, or one of a backend that cannot reset it, is not kept."""
        if self._pending is not None and self._pending.model is model:
            self._kept = self._pending
        self._pending = None


def _reinitialise(kept: _Kept, seed: int) -> None:
    """The kept model as a fresh build with ``seed`` leaves it: weights drawn again, no gradients, training mode."""
    model = kept.model
    apply_init([(kept.plain[name], how) for name, how in kept.plan], seed, next(model.parameters()).device)
    _fresh(model)


def _load(kept: _Kept, weights: Mapping[str, torch.Tensor]) -> None:
    """The kept model as a fresh build from ``weights`` leaves it: a build loads them into the plain model, casts
    it to the parameter dtype and hands the values to the backend, so each is copied in with the same rounding."""
    if set(weights) != set(kept.plain):
        raise ValueError(f"weights for another model: {sorted(set(weights) ^ set(kept.plain))[:3]} differ")
    with torch.no_grad():
        for name, tensor in kept.plain.items():
            tensor.copy_(_beside(weights[name], tensor))  # a cast rounds to nearest even, as model.to(dtype) does
    _fresh(kept.model)


def _beside(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``source`` on ``target``'s device, in its own dtype. PyTorch's ``copy_`` from host memory into a GPU tensor
    of another dtype converts on the CPU into a pageable temporary first: with a state of the 8B probe in host
    memory, a reading's side took 1.1-1.5 s a state through the kept model (H100, 2026-12-05) against 0.6 s
    through a fresh build, which loads the FP32 values as they are and rounds on the GPU. So the state's tensor
    (page-locked: an asynchronous DMA copy) moves first and the GPU rounds it, to the same values."""
    if source.device == target.device or source.dtype == target.dtype:
        return source
    return source.to(target.device, non_blocking=True)


def _fresh(model: Llama3) -> None:
    """No gradients, RoPE frequencies recomputed, training mode: as a build leaves a model."""
    model.rotary_pos_emb.reset_inv_freq()
    for param in model.parameters():
        param.grad = None
    model.train()


def named_plan(model: Llama3) -> list[tuple[str, str]]:
    """:func:`~precsearch.probe.model.llama3.init_plan` of the plain ``model``, by Parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(names[id(t)], how) for t, how in init_plan(model)]
