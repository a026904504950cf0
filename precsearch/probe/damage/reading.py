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

Each unit is compared in one streaming pass (:func:`compare_unit`): ``CHUNK``
elements of the flattened unit at a time (``CPU_CHUNK`` on a CPU), the K batches'
gradients of both sides, their errors, the baseline updates and the policy's
update errors as K x chunk float32 blocks, each block's float64 Gram matrix added
into the unit's on the device (:func:`.gram.gram_of_stacked`), read back once per
unit; the state's weight and moments are copied (host-kept states) a chunk at a
time. So the step's temporaries are a few K x chunk blocks whatever a unit's
size, and each chunk's stored moments and kept weight are computed once for all K
batches. Storages with a per-tensor scale (FP8 moments, an FP16 master) take the
whole tensor's amax first, in a pass of their own (:mod:`.update`): the figures
are those of the whole-tensor computation, the Gram matrices to the order of
their float64 sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from precsearch.backends.base import Backend
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import Policy
from precsearch.precision import Precision
from precsearch.probe.damage import gram
from precsearch.probe.damage.states import State, reading_batch, state_model
from precsearch.probe.damage.update import MOMENTS, SCALED, Storage, StepDtypes, UnitStep
from precsearch.probe.data import TokenBatches
from precsearch.probe.runner import eval_losses
from precsearch.arch.units import unit_names
from precsearch.probe.model.llama3 import ModelConfig

#: The figures a reading reports per state (and per unit, but ``forward``, which is the whole model's).
MEASURES = ("grad_noise", "grad_bias_noise", "grad_var_noise", "grad_norm", "update_noise", "update_norm",
            "forward")


@dataclass
class Side:
    """One model's part of the reading at one state: per batch, each unit's weight gradient; held-out losses."""

    grads: list[dict[str, Tensor]]
    eval_losses: list[float]


def measure_side(cfg: ModelConfig, probe: ProbeSection, data: TokenBatches, backend: Backend, device: torch.device,
                 state: State, policy: Policy, settings: DamageSection) -> Side:
    """The gradients and held-out losses of ``policy``'s probe at ``state`` (BF16: ``Policy.bf16``)."""
    model = state_model(cfg, state, policy, backend, device, probe.seed, probe.param_dtype)
    fp8_on = policy.uses_fp8 and state.step >= policy.warmup_steps
    units = unit_names(cfg)
    recipes = policy.layer_recipes(units, cfg.n_layers).values()
    delayed = fp8_on and any(r.precision is Precision.FP8_DELAYED for r in recipes)
    for k in range(settings.warm_batches if delayed else 0):  # fills delayed scaling's amax history
        _backward(model, backend, device, reading_batch(data, settings.batches + k), fp8_on)
    grads = []
    for k in range(settings.batches):
        _backward(model, backend, device, reading_batch(data, k), fp8_on)
        grads.append({u: backend.unit_weight(model, u).grad.detach().clone() for u in units})
    model.zero_grad(set_to_none=True)
    losses = eval_losses(model, data, backend, device, fp8_on)
    del model
    return Side(grads=grads, eval_losses=losses)


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


#: Elements of a unit compared at once on an accelerator (:func:`compare_unit`): a few K x CHUNK float32 blocks
#: are the compare step's temporaries (K = 4: 256 MiB each), whatever the unit's size.
CHUNK = 2**24
#: The same on a CPU, where blocks that fit the caches (and the allocator's reuse) are 3-4x faster than 2**24
#: (scripts/bench_damage_compare.py); the figures do not depend on the chunk but by float64 summation order.
CPU_CHUNK = 2**18


def default_chunk(device: torch.device) -> int:
    """:data:`CPU_CHUNK` on a CPU, else :data:`CHUNK`."""
    return CPU_CHUNK if device.type == "cpu" else CHUNK


#: The four Gram matrices of a unit, in the order :func:`compare_unit` stacks them.
GRAMS = ("g", "e", "u", "ue")


def read_state(bf16: Side, pol: Side, state: State, policy: Policy, probe: ProbeSection,
               settings: DamageSection, device: torch.device, *, chunk: int | None = None) -> StateReading:
    """Compare the two sides at ``state`` (see the module docstring), ``chunk`` elements of a unit at a time
    (None: :func:`default_chunk`)."""
    chunk = chunk or default_chunk(device)
    r = settings.tokens_per_step / (probe.micro_batch * probe.seq_len)
    dtypes = StepDtypes.of(policy.memory, probe.param_dtype)
    args = (state.step, state.lr, probe.betas, probe.weight_decay)
    grams: dict[str, dict[str, Tensor]] = {}
    for unit in bf16.grads[0]:
        grams[unit] = compare_unit([b[unit] for b in bf16.grads], [b[unit] for b in pol.grads],
                                   state.weights[f"{unit}.weight"], state.moments.get(unit), dtypes, args, device,
                                   chunk)
    total = {key: sum(gm[key] for gm in grams.values()) for key in GRAMS}
    reading = StateReading(step=state.step, total=_figures(total, r) | {"forward": _forward(bf16, pol)})
    reading.units = {unit: _figures(gm, r) for unit, gm in grams.items()}
    return reading


def compare_unit(g: list[Tensor], p: list[Tensor], weight: Tensor, moments: tuple[Tensor, Tensor] | None,
                 dtypes: StepDtypes, args: tuple[int, float, tuple[float, float], float], device: torch.device,
                 chunk: int | None = None) -> dict[str, Tensor]:
    """One unit's four float64 Gram matrices (host), over its K batches: of the BF16 gradients ``g``, the errors
    ``e = p - g``, the baseline updates ``u`` and the policy's update errors ``ue`` (:class:`.update.UnitStep`).

    One pass over ``chunk``-element slices of the flattened unit (None: :func:`default_chunk`): per slice, K x
    chunk float32 blocks of ``g``, ``p`` (kept BF16 or float32, on ``device``), ``e``, ``u`` and ``ue``, each
    added into its Gram matrix on the device, and the matrices read back once at the end. The state's weight
    and moments (``None``: zeros, a state before the first step) are sliced too: a host-kept state (pinned) is
    copied to ``device`` a slice at a time, a device-kept one is only sliced. A storage with a per-tensor scale
    (FP8 moments, an FP16 master) first takes the whole tensor's amax in a pass of its own, the max over the
    slices (exact); an FP16 master also rounds each batch's ``before + update`` with that sum's amax, taken in
    one more pass before the Gram pass.
    """
    chunk = chunk or default_chunk(device)
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 element, got {chunk}")
    k = len(g)
    flat_w = weight.reshape(-1)
    flat_m = None if moments is None else tuple(m.reshape(-1) for m in moments)
    g = [t.reshape(-1) for t in g]
    p = [t.reshape(-1) for t in p]
    n = flat_w.numel()
    spans = [slice(start, min(start + chunk, n)) for start in range(0, n, chunk)]

    def state_at(span: slice) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        w = flat_w[span].to(device, non_blocking=True)
        if flat_m is None:
            zeros = torch.zeros_like(w)
            return w, (zeros, zeros)
        return w, tuple(m[span].to(device, non_blocking=True) for m in flat_m)

    def rows(vectors: list[Tensor], span: slice) -> Tensor:
        block = torch.empty(k, span.stop - span.start, dtype=torch.float32, device=device)
        for i, v in enumerate(vectors):
            block[i].copy_(v[span])
        return block

    amax = _amax({name: t for name, t in (("weight", flat_w), *zip(MOMENTS, flat_m or (None, None)))
                  if name in dtypes.scaled()}, spans, device)
    step = UnitStep(dtypes, args, amax)
    landed = None
    if dtypes.keep in SCALED:  # per batch, the amax of the whole before + update, before anything is rounded
        sums = None
        for span in spans:
            w, m = state_at(span)
            a = step.landed_amax(w, rows(p, span), m)
            sums = a if sums is None else torch.maximum(sums, a)
        landed = Storage(dtypes.keep, sums)
    acc = torch.zeros(len(GRAMS), k, k, dtype=torch.float64, device=device)
    for span in spans:
        w, m = state_at(span)
        gs = rows(g, span)
        gram.gram_of_stacked(gs, acc[0])
        u = step.baseline(w, gs, m)
        gram.gram_of_stacked(u, acc[2])
        ps = rows(p, span)
        e = ps - gs
        del gs
        gram.gram_of_stacked(e, acc[1])
        del e
        ue = step.applied(w, ps, m, landed) - u
        del ps, u
        gram.gram_of_stacked(ue, acc[3])
        del ue
    acc = gram.symmetric(acc).cpu()  # the unit's one host sync
    return dict(zip(GRAMS, acc.unbind(0)))


def _amax(tensors: dict[str, Tensor | None], spans: list[slice], device: torch.device) -> dict[str, Tensor]:
    """Each flattened tensor's ``abs().max()``, taken over ``spans`` (a slice at a time on ``device``); a ``None``
    tensor (moments before the first step) is zeros: 0."""
    out = {}
    for name, t in tensors.items():
        if t is None:
            out[name] = torch.zeros((), dtype=torch.float32, device=device)
            continue
        best = None
        for span in spans:
            a = t[span].to(device, non_blocking=True).abs().max()
            best = a if best is None else torch.maximum(best, a)
        out[name] = best
    return out


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
