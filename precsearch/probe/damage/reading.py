"""The fixed-state damage reading: what a policy's quantization does to one training step, in SGD noise.

At a few states of the BF16 reference run (:mod:`.states`), on the same
weights and the same K batches, without training further, the policy's probe
and the BF16 probe each compute every precision unit's weight gradient. Per
batch k the policy's error is ``e_k = g_k(policy) - g_k(BF16)``; the BF16
gradients' own spread over the batches is the minibatch gradient noise. With
:mod:`.gram`, each figure is a ratio of unbiased estimates, with a jackknife
standard error over the batches (the reading's only randomness: at a state the
computation is deterministic, so a BF16 policy reads exactly 0).

The noise of a B-token batch is ``B0 / B`` times the noise of the probe's
B0-token batch; so is the error's variance (quantization noise averages over
tokens like sampling noise does), but not its bias, which every token shares.
For the training run's tokens per step B (``objectives.damage.tokens_per_step``):

* ``grad_noise`` = (|bias|^2 B/B0 + var(e)) / noise(B0): the extra mean squared
  gradient error, in units of the gradient noise of a B-token step;
  ``grad_bias_noise`` and ``grad_var_noise`` are its two terms;
* ``grad_norm`` = |bias|^2 / |mean gradient|^2: the bias against the gradient;
* ``update_noise``: ``grad_noise`` for the AdamW update instead of the gradient
  (:mod:`.update`): the policy's update (its gradients, through its stored
  moments and into the storage its memory knobs keep updates in) against the
  baseline's exact update, in units of the baseline updates' batch spread; the
  figure, with ``update_norm``, that sees memory knobs (lost updates, rounded moments);
* ``update_norm`` = |update error's mean|^2 / |mean update|^2: ``grad_norm``
  for the AdamW update; like ``grad_norm`` it does not depend on the batch;
* ``forward``: the relative held-out loss change at the state's weights.

All squared figures are ratios of squared norms. The trial's reading is the
largest over the states of the figure ``objectives.damage.measure`` names.

A non-finite value in the policy's side (a unit's gradient or AdamW update at a
state, or its held-out loss) is named in ``StateReading.nonfinite`` and makes the
trial infeasible whatever the figures say. The compare finds it at no extra cost:
a Gram matrix is non-finite exactly when one of the float64 rows it is made of is
(a square of any FP32 value fits float64), so the ``e`` matrix tells of the
gradients and the ``ue`` matrix of the updates.

Each unit is compared in one streaming pass over chunks of its flattened tensors
(:mod:`.compare`), the BF16 side's own Gram matrices once per state
(:func:`side_grams`) and each chunk's elementwise step fused on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from precsearch.backends.base import Backend
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import Policy
from precsearch.recipes import recipe_for
from precsearch.probe.damage import gram
from precsearch.probe.damage.spill import SpillFile, Spilled, source
from precsearch.probe.damage.states import State, reading_batch, state_model
from precsearch.probe.damage.compare import GRAMS, StepArgs, baseline_grams, compare_unit
from precsearch.probe.damage.update import StepDtypes
from precsearch.probe.data import TokenBatches
from precsearch.probe.model.reuse import ModelCache
from precsearch.probe.runner import eval_losses
from precsearch.arch.units import unit_names
from precsearch.probe.model.llama3 import ModelConfig

#: The figures a reading reports per state (and per unit, but ``forward``, which is the whole model's).
MEASURES = ("grad_noise", "grad_bias_noise", "grad_var_noise", "grad_norm", "update_noise", "update_norm",
            "forward")


@dataclass
class Side:
    """One model's part of the reading at one state: per batch, each unit's weight gradient; held-out losses."""

    grads: list[Mapping[str, Tensor]]  # per batch: a dict, or on disk a :class:`.spill.Spilled`
    eval_losses: list[float]
    #: The BF16 side's own Gram matrices per unit (``g``, ``u``), kept by the reader (:func:`side_grams`).
    grams: dict[str, dict[str, Tensor]] | None = None


def measure_side(cfg: ModelConfig, probe: ProbeSection, data: TokenBatches, backend: Backend, device: torch.device,
                 state: State, policy: Policy, settings: DamageSection, models: ModelCache | None = None,
                 spill: SpillFile | None = None) -> Side:
    """The gradients and held-out losses of ``policy``'s probe at ``state`` (BF16: ``Policy.bf16``); ``models``
    keeps the model for the next state or trial (:mod:`precsearch.probe.model.reuse`). With ``spill`` each
    gradient is written to that file as soon as it is taken (``keep_states: disk``): only one backward pass's
    gradients are in memory at a time, not ``settings.batches``'."""
    model = state_model(cfg, state, policy, backend, device, probe, models)
    fp8_on = policy.uses_fp8 and state.step >= policy.warmup_steps
    units = unit_names(cfg)
    recipes = policy.layer_recipes(units, cfg.n_layers).values()
    history = fp8_on and any(recipe_for(r.precision).history for r in recipes)
    for k in range(settings.warm_batches if history else 0):  # fills delayed scaling's amax history
        _backward(model, backend, device, reading_batch(data, settings.batches + k), fp8_on)
    grads = []
    for k in range(settings.batches):
        _backward(model, backend, device, reading_batch(data, k), fp8_on)
        taken = ((u, _take_grad(backend.unit_weight(model, u))) for u in units)  # one unit's at a time
        grads.append({u: g for u, g in taken} if spill is None else Spilled({u: spill.write(g) for u, g in taken}))
    model.zero_grad(set_to_none=True)
    losses = eval_losses(model, data, backend, device, fp8_on)
    if models is not None:
        models.keep(model)
    del model
    return Side(grads=grads, eval_losses=losses)


def _take_grad(weight: Tensor) -> Tensor:
    """``weight``'s gradient, taken from it (``weight.grad`` is None after) and kept by :func:`kept_grad`.

    A gradient that owns its storage is taken as it is, not copied (a copy would be a second unit-sized
    tensor for a moment); one that is a view into a buffer the backend may reuse is copied."""
    grad = weight.grad.detach()
    owns = grad.storage_offset() == 0 and grad.untyped_storage().nbytes() == grad.numel() * grad.element_size()
    weight.grad = None
    return kept_grad(grad if owns else grad.clone())


def kept_grad(grad: Tensor) -> Tensor:
    """``grad`` as the reading keeps it until the compare: in BF16 when that holds every value exactly, else as
    it is. BF16 autocast's weight gradients are BF16 GEMM outputs widened to FP32, so the BF16 side's (and a
    policy's BF16 units') take half the memory for the same values; the compare widens them back
    (:func:`.compare.chunk_rows`), so the figures do not change. A gradient with a NaN stays FP32 (NaN is not equal
    to itself); infinities are exact in BF16."""
    if grad.dtype != torch.float32:
        return grad
    low = grad.to(torch.bfloat16)
    a, b = low.reshape(-1), grad.reshape(-1)
    exact = torch.ones((), dtype=torch.bool, device=grad.device)
    for i in range(0, b.numel(), _CHECK):  # on the device, read once (one host sync per tensor)
        exact &= (a[i:i + _CHECK].float() == b[i:i + _CHECK]).all()
    return low if bool(exact) else grad


#: Elements :func:`kept_grad` checks at once (its temporary: one float32 block of this size).
_CHECK = 2**22


def _backward(model, backend: Backend, device: torch.device, batch: tuple[Tensor, Tensor], fp8_on: bool) -> None:
    model.zero_grad(set_to_none=True)
    inputs, targets = (t.to(device) for t in batch)
    with backend.autocast(model, enabled=fp8_on), torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(inputs, targets)
    loss.backward()



@dataclass
class StateReading:
    """The figures of one state: ``total`` over the units, and ``units`` (name -> figures); each figure a
    ``(value, standard error)`` pair."""

    step: int
    total: dict[str, tuple[float, float]]
    units: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    #: The policy's first non-finite tensor at this state (``UNIT.weight gradient`` / ``update``, ``held-out
    #: loss``), or None.
    nonfinite: str | None = None


def read_state(bf16: Side, pol: Side, state: State, policy: Policy, probe: ProbeSection,
               settings: DamageSection, device: torch.device, *, chunk: int | None = None) -> StateReading:
    """Compare the two sides at ``state`` (see the module docstring), ``chunk`` elements of a unit at a time
    (None: :func:`.compare.default_chunk`). The BF16 side's own Gram matrices are ``bf16.grams`` where the
    reader keeps them (:func:`side_grams`), else computed here."""
    r = settings.tokens_per_step / (probe.micro_batch * probe.seq_len)
    dtypes = StepDtypes.of(policy.memory, probe.param_dtype)
    args = step_args(state, probe)
    grams: dict[str, dict[str, Tensor]] = {}
    for unit in bf16.grads[0]:
        grams[unit] = compare_unit([source(b, unit) for b in bf16.grads], [source(b, unit) for b in pol.grads],
                                   source(state.weights, f"{unit}.weight"), source(state.moments, unit, None),
                                   dtypes, args, device,
                                   chunk, base=(bf16.grams or {}).get(unit),
                                   compile_compare=settings.compile_compare)
    total = {key: sum(gm[key] for gm in grams.values()) for key in GRAMS}
    reading = StateReading(step=state.step, total=_figures(total, r) | {"forward": _forward(bf16, pol)})
    reading.units = {unit: _figures(gm, r) for unit, gm in grams.items()}
    reading.nonfinite = first_nonfinite(grams, pol)
    return reading


def first_nonfinite(grams: dict[str, dict[str, Tensor]], pol: Side) -> str | None:
    """The policy side's first non-finite tensor, unit by unit (its gradient, then its update), then the
    held-out loss; None when all are finite (see the module docstring)."""
    for unit, gm in grams.items():
        for key, what in (("e", "gradient"), ("ue", "update")):
            if not bool(torch.isfinite(gm[key]).all()):
                return f"{unit}.weight {what}"
    return None if all(math.isfinite(x) for x in pol.eval_losses) else "held-out loss"


def side_grams(bf16: Side, state: State, probe: ProbeSection, settings: DamageSection, device: torch.device, *,
               chunk: int | None = None) -> dict[str, dict[str, Tensor]]:
    """The BF16 side's Gram matrices at ``state``, per unit (``g`` and ``u``: :func:`.compare.baseline_grams`),
    which every policy's compare at that state shares."""
    args = step_args(state, probe)
    return {unit: baseline_grams([source(b, unit) for b in bf16.grads], source(state.weights, f"{unit}.weight"),
                                 source(state.moments, unit, None), args, device, chunk,
                                 compile_compare=settings.compile_compare)
            for unit in bf16.grads[0]}


def step_args(state: State, probe: ProbeSection) -> StepArgs:
    """The step taken at ``state``: (its 0-based step, learning rate, betas, weight decay)."""
    return state.step, state.lr, probe.betas, probe.weight_decay


def _excess(r: float) -> Callable[[Tensor], float]:
    return lambda e: gram.mean_sq(e) * r + gram.spread(e)


def _figures(gm: dict[str, Tensor], r: float) -> dict[str, tuple[float, float]]:
    return {
        "grad_noise": gram.ratio(_excess(r), gram.spread, (gm["e"], gm["g"])),
        "grad_bias_noise": gram.ratio(lambda e: gram.mean_sq(e) * r, gram.spread, (gm["e"], gm["g"])),
        "grad_var_noise": gram.ratio(gram.spread, gram.spread, (gm["e"], gm["g"])),
        "grad_norm": gram.ratio(gram.mean_sq, gram.mean_sq, (gm["e"], gm["g"])),
        "update_noise": gram.ratio(_excess(r), gram.spread, (gm["ue"], gm["u"])),
        "update_norm": gram.ratio(gram.mean_sq, gram.mean_sq, (gm["ue"], gm["u"])),
    }


def _forward(bf16: Side, pol: Side) -> tuple[float, float]:
    changes = torch.tensor([p / b - 1 for p, b in zip(pol.eval_losses, bf16.eval_losses)], dtype=torch.float64)
    se = float(changes.std() / math.sqrt(len(changes))) if len(changes) > 1 else math.nan
    return float(changes.mean()), se
