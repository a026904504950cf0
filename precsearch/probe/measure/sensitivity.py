"""Per-unit sensitivity of a BF16-trained probe: what switching one unit to a precision does to the loss.

The probe is trained once in BF16 (the plain PyTorch model, on any device), for
the space's probe steps and learning-rate schedule. Then each unit x precision
is scored on the held-out batches with only that unit's GEMM quantized, using
the same quantizers as the emulated backend (:mod:`precsearch.fp8.scaling`), so
the pass runs wherever the probe does (CPU, or a GPU next to Transformer Engine)
and never needs the low-precision kernels themselves.

Two estimators, both from that one trained model:

* ``forward``: the held-out loss with the unit's output replaced by
  ``Q(x) @ Q(W).T`` (FP32 accumulation), minus the BF16 loss, relative to it:
  the loss change the switch causes in the forward pass, measured exactly.
  One forward pass per unit x precision x batch.
* ``taylor``: the diagonal-Fisher estimate ``sum((dL/dy * dy)**2)`` over the
  batches, ``dy`` the unit's output error under quantization and ``dL/dy`` its
  output gradient from one BF16 backward: the score NVIDIA ModelOpt's
  ``auto_quantize`` ranks layers with. One forward and backward in all.

Neither sees what quantizing the *gradients* does over a training run, nor the
staleness of delayed scaling (a delayed scaler is warmed on the tensor itself,
so it reads as current scaling): how well either ranks the units against short
probes with one unit switched is measured by ``bench_search.py@dffbdfa``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.fp8.scaling import make_scaler
from precsearch.policy import MemoryKnobs, Policy
from precsearch.precision import LayerRecipe, Precision
from precsearch.recipes import recipe_for
from precsearch.probe.data import TokenBatches
from precsearch.probe.model.llama3 import Llama3, ModelConfig, rms_norm
from precsearch.probe.runner import _lr_lambda, _train_step, build_probe

ESTIMATORS = ("forward", "taylor")


def train_bf16(cfg: ModelConfig, probe: ProbeSection, data: TokenBatches, device: torch.device,
               clip_grad: float | None) -> Llama3:
    """The probe trained in BF16 for ``probe.steps`` steps, as the BF16 reference probe trains it."""
    backend = EmulatedBackend()
    model = build_probe(cfg, Policy.bf16(clip_grad), backend, device, probe.seed, probe.param_dtype)
    opt = backend.build_optimizer(model, MemoryKnobs(), lr=probe.lr, betas=probe.betas,
                                  weight_decay=probe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(probe))
    for step in range(probe.steps):
        _train_step(model, opt, data, step, False, clip_grad, backend, device, accum=probe.grad_accum)
        sched.step()
    return model


def quantized_gemm(module: nn.Module, x: Tensor, recipe: LayerRecipe) -> tuple[Tensor, Tensor]:
    """``(Q(x) @ Q(W).T, x @ W.T)`` in float32 for a unit's GEMM (its fused RMSNorm applied to ``x`` first)."""
    if getattr(module, "layer_norm_weight", None) is not None:
        x = rms_norm(x, module.layer_norm_weight, module.eps)
    x2d, w = x.reshape(-1, x.shape[-1]).float(), module.weight.float()
    qx, qw = _quantize(recipe, "input", x2d), _quantize(recipe, "weight", w)
    shape = (*x.shape[:-1], w.shape[0])
    return (qx @ qw.t()).reshape(shape), (x2d @ w.t()).reshape(shape)


def _quantize(recipe: LayerRecipe, role: str, t: Tensor) -> Tensor:
    scaler = make_scaler(recipe, role)
    if recipe_for(recipe.precision).history:
        scaler.quantize(t)  # one call fills the amax history; the next quantizes with its scale
    return scaler.quantize(t)


@contextmanager
def _switched(module: nn.Module, recipe: LayerRecipe):
    """Within the block, ``module``'s output is its quantized GEMM's."""
    def hook(mod: nn.Module, args: tuple, output: Tensor) -> Tensor:
        with torch.autocast(output.device.type, enabled=False):
            quantized, _ = quantized_gemm(mod, args[0], recipe)
        return quantized.to(output.dtype)

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _loss(model: Llama3, batch: tuple[Tensor, Tensor], device: torch.device) -> float:
    inputs, targets = (t.to(device) for t in batch)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        return float(model(inputs, targets))


@torch.no_grad()
def forward_scores(model: Llama3, units: Iterable[str], precisions: Iterable[Precision], recipe: LayerRecipe,
                   batches: list[tuple[Tensor, Tensor]], device: torch.device) -> dict[tuple[str, Precision], float]:
    """(unit, precision) -> relative held-out loss change with only that unit switched."""
    model.eval()
    base = sum(_loss(model, b, device) for b in batches)
    out = {}
    for unit in units:
        module = model.get_submodule(unit)
        for p in precisions:
            with _switched(module, _recipe(recipe, p)):
                switched = sum(_loss(model, b, device) for b in batches)
            out[unit, p] = (switched - base) / base if math.isfinite(switched) else math.inf
    model.train()
    return out


def taylor_scores(model: Llama3, units: Iterable[str], precisions: Iterable[Precision], recipe: LayerRecipe,
                  batches: list[tuple[Tensor, Tensor]], device: torch.device) -> dict[tuple[str, Precision], float]:
    """(unit, precision) -> ``sum((dL/dy * (y_q - y))**2)`` over the batches (diagonal Fisher)."""
    units, precisions = list(units), list(precisions)
    out = {(u, p): 0.0 for u in units for p in precisions}
    for batch in batches:
        captured = _capture(model, units, lambda: _backward(model, batch, device))
        with torch.no_grad():
            for unit, (x, grad) in captured.items():
                module = model.get_submodule(unit)
                for p in precisions:
                    quantized, exact = quantized_gemm(module, x, _recipe(recipe, p))
                    out[unit, p] += float(((quantized - exact) * grad).pow(2).sum())
    model.zero_grad(set_to_none=True)
    return out


def _backward(model: Llama3, batch: tuple[Tensor, Tensor], device: torch.device) -> None:
    inputs, targets = (t.to(device) for t in batch)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(inputs, targets)
    loss.backward()


def _capture(model: Llama3, units: list[str], run: Callable[[], None]) -> dict[str, tuple[Tensor, Tensor]]:
    """Each unit's input and output gradient during ``run`` (one forward and backward)."""
    inputs: dict[str, Tensor] = {}
    grads: dict[str, Tensor] = {}
    handles = []
    for unit in units:
        def hook(mod, args, output, unit=unit):
            inputs[unit] = args[0].detach()
            output.register_hook(lambda g, unit=unit: grads.__setitem__(unit, g.detach().float()))
        handles.append(model.get_submodule(unit).register_forward_hook(hook))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return {u: (inputs[u], grads[u]) for u in units}


def _recipe(recipe: LayerRecipe, precision: Precision) -> LayerRecipe:
    """``recipe`` with ``precision``: every other field kept (the NVFP4 switches too: 2D weight tiles change Q(W))."""
    return dataclasses.replace(recipe, precision=precision)


def unit_scores(estimator: str, model: Llama3, units: Iterable[str], precisions: Iterable[Precision],
                recipe: LayerRecipe, batches: list[tuple[Tensor, Tensor]],
                device: torch.device) -> dict[tuple[str, Precision], float]:
    """The scores of ``estimator`` (``forward`` or ``taylor``); BF16 is never scored (it is the reference)."""
    low = [p for p in precisions if p.is_fp8]
    if estimator == "forward":
        return forward_scores(model, units, low, recipe, batches, device)
    if estimator == "taylor":
        return taylor_scores(model, units, low, recipe, batches, device)
    raise ValueError(f"unknown estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}")
