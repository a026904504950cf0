"""The states of the BF16 reference run a fixed-state reading is taken at, and the BF16 side of it.

A state is the BF16 run's weights and AdamW moments just before a given step
(step 0: the initial weights, or the checkpoint of ``model.init_from``; step
``probe.steps``: after the last step). The run is the plain-PyTorch probe in
BF16 autocast with FP32 parameters and moments, which is the standard baseline
(BF16 compute, FP32 master weights and moments) on any device, on the same
data, seed, schedule and gradient clipping as the trial's reference.

At each state the BF16 side of the reading is computed once and shared by every
trial with the same gradient clipping (like the references): the BF16 model's
weight gradient of every precision unit on each of the reading's batches, and
its held-out loss per batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from precsearch.arch.hf_checkpoint import CheckpointStart
from precsearch.backends.base import Backend
from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.policy import MemoryKnobs, Policy
from precsearch.probe.damage.spill import SpillFile, write_all
from precsearch.probe.damage.spilled_adamw import SpilledMomentsAdamW, moments_of
from precsearch.probe.data import TokenBatches
from precsearch.arch.units import unit_names
from precsearch.utils.pinned import PinnedBlock
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.model.reuse import ModelCache
from precsearch.probe.runner import ONE_PROCESS, _lr_lambda, _probe_model, _train_step, build_probe

#: The reading's batches are drawn as training steps from here on: far past any probe's steps, so they are
#: batches the run never trained on, and the same for every trial (a function of the data seed only).
READING_STEP0 = 1_000_000


@dataclass
class State:
    """The BF16 run just before ``step``: weights (plain layout, FP32) and AdamW moments.

    Its tensors are in host memory, or on the run's device with ``reference_states(keep_on_device=True)``, or
    on disk with ``reference_states(spill=...)`` (``weights`` and ``moments`` then :class:`.spill.Spilled`: each
    tensor read back when indexed).

    Attributes:
        step: Steps the run had taken.
        weights: ``state_dict`` of the plain probe.
        moments: Unit name -> (exp_avg, exp_avg_sq) of its weight; empty at step 0.
        lr: The learning rate of the next step (the schedule's value at ``step``).
    """

    step: int
    weights: Mapping[str, Tensor]
    moments: Mapping[str, tuple[Tensor, Tensor]] = field(default_factory=dict)
    lr: float = 0.0
    pinned: PinnedBlock | None = field(default=None, repr=False)  # the host memory the tensors are views into


def reference_states(cfg: ModelConfig, probe: ProbeSection, data: TokenBatches, device: torch.device,
                     clip_grad: float | None, at: list[int], init: CheckpointStart | None = None, *,
                     keep_on_device: bool = False, spill: SpillFile | None = None) -> list[State]:
    """Train the BF16 probe (FP32 parameters and moments) and keep its state before each step in ``at``.

    The states are kept in host memory, or with ``keep_on_device`` on ``device`` (no copy back per trial, at
    the device memory of a state's weights and moments: ``objectives.damage.keep_states``), or with ``spill``
    written to that file straight from the run's tensors (``keep_states: disk``; no copy in memory).
    """
    backend = EmulatedBackend()
    model = build_probe(cfg, Policy.bf16(clip_grad), backend, device, probe.seed, "fp32", init)
    if init is not None and data.seed != probe.seed:
        data = data.with_seed(probe.seed)  # as run_probe: a checkpoint start draws its windows from the seed
    moments_file = SpillFile(spill.directory) if spill is not None and device.type == "cpu" else None
    if moments_file is not None:  # the run's moments on disk between steps too (.spilled_adamw)
        opt = SpilledMomentsAdamW(model.parameters(), moments_file, lr=probe.lr, betas=probe.betas,
                                  weight_decay=probe.weight_decay)
    else:
        opt = backend.build_optimizer(model, MemoryKnobs(), lr=probe.lr, betas=probe.betas,
                                      weight_decay=probe.weight_decay)
    try:
        return _run(model, opt, cfg, probe, data, device, clip_grad, at, backend, keep_on_device, spill)
    finally:
        if moments_file is not None:
            moments_file.close()


def _run(model, opt, cfg: ModelConfig, probe: ProbeSection, data: TokenBatches, device: torch.device,
         clip_grad: float | None, at: list[int], backend: Backend, keep_on_device: bool,
         spill: SpillFile | None) -> list[State]:
    """:func:`reference_states`' run with its model and optimizer made."""
    factor = _lr_lambda(probe)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    units = unit_names(cfg)
    states = []
    for step in range(max(at) + 1):
        if step in at:
            # the last state is the run's own tensors where no copy is needed (the run ends there): a copy
            # would hold the state twice at the BF16 side's peak
            states.append(_snapshot(model, opt, units, step, probe.lr * factor(step), keep_on_device,
                                    take=step == max(at), spill=spill))
        if step < max(at):
            _train_step(model, opt, data, step, False, clip_grad, backend, device, accum=probe.grad_accum)
            sched.step()
    return states


def _on_device(t: Tensor) -> Tensor:
    """A float32 copy of ``t`` where it is (never a view: the run trains on after the snapshot)."""
    return t.detach().to(dtype=torch.float32, copy=True)


def _taken(t: Tensor) -> Tensor:
    """``t`` itself, detached (no copy) where it is float32, for a state the run no longer trains past."""
    return t.detach() if t.dtype == torch.float32 else _on_device(t)


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer, units: list[str], step: int, lr: float,
              keep_on_device: bool = False, take: bool = False, spill: SpillFile | None = None) -> State:
    """The run's weights and unit moments now, as float32 copies on the device, or in host memory: page-locked
    when they come from a GPU (every reading copies them back; a state of an 8B-wide probe is ~18 GB, which
    pageable copies take seconds for), all in one :class:`~precsearch.utils.pinned.PinnedBlock` of their size;
    or, with ``spill``, written to that file one tensor at a time (float32)."""
    params = dict(model.named_parameters())
    moments = {}
    for unit in units:
        pair = moments_of(opt, params[f"{unit}.weight"])
        if pair is not None:
            moments[unit] = pair
    weights = model.state_dict()
    if spill is not None:  # one tensor at a time (moments on disk are read one at a time too)
        return State(step=step, weights=write_all(spill, {k: v.float() for k, v in weights.items()}),
                     moments=write_all(spill, moments), lr=lr)
    sources = [*weights.values(), *(m for pair in moments.values() for m in pair)]
    if take and (keep_on_device or not any(t.is_cuda for t in sources)):
        keep, block = _taken, None  # where the state stays: the run's float32 tensors themselves
    elif keep_on_device:
        keep, block = _on_device, None
    elif any(t.is_cuda for t in sources):
        block = PinnedBlock([t.shape for t in sources])
        keep = lambda t: block.take(t.shape).copy_(t.detach())  # noqa: E731 - a cast on the way: the copy converts
    else:
        keep, block = (lambda t: t.detach().float().clone()), None
    return State(step=step, weights={k: keep(v) for k, v in weights.items()},
                 moments={u: (keep(a), keep(b)) for u, (a, b) in moments.items()}, lr=lr, pinned=block)


def state_model(cfg: ModelConfig, state: State, policy: Policy, backend: Backend, device: torch.device,
                probe: ProbeSection, models: ModelCache | None = None) -> torch.nn.Module:
    """The probe at ``state``'s weights in ``probe.param_dtype``, its units converted per ``policy`` by ``backend``:
    ``models``'s kept model with the weights copied in where it was built for the same policy (the trial's
    probe, the previous state's), else a fresh build."""
    backend = backend.for_memory(policy.memory)
    model = _probe_model(cfg, probe, policy, backend, device, ONE_PROCESS, None, models, weights=state.weights)
    # no FP8 statistics: the reading reads none, and an emulated layer's cost a third of its pass on a CPU
    backend.track_stats(model, False)
    return model


def reading_batch(data: TokenBatches, k: int) -> tuple[Tensor, Tensor]:
    """The reading's batch ``k`` (the same for every trial and state)."""
    return data.train_batch(READING_STEP0 + k)
