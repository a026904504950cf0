"""Continuing a probe from a saved state: one run cut into legs (the rungs of a study).

A :class:`Leg` tells :func:`~precsearch.probe.runner.run_probe` three things:

* ``horizon``: the learning-rate schedule (warm-up, cosine) is laid out over
  this many steps, not over the leg's own ``probe.steps``, so that a 50-step
  leg is exactly the first 50 steps of the 800-step run it may grow into;
* ``resume_from``: a checkpoint to continue from (None: start at step 0);
* ``save_to``: where to write the state at the end of the leg (None: nothing).

A checkpoint holds everything the next step depends on, so continuing gives
the same steps as never having stopped: the model's ``state_dict`` (weights,
and the backend state that lives there, e.g. Transformer Engine's FP8
metadata), FP8 scaler state that lives outside it (the emulated backend's
delayed-scaling amax history and scale), the optimizer and LR scheduler
states, the RNG states, the event monitor's baselines, the number of steps
done (the data position: batches are a function of seed and step) and the
per-step records so far (losses, gradient norms, events, FP8 statistics), so
that the continued result covers the whole run from step 0. The state is saved
*before* the held-out evaluation, which runs FP8 forwards that would otherwise
advance the delayed-scaling history.

A checkpoint is the size of the model plus its optimizer state (a few MB for
the CPU probes, about 16 bytes per parameter with fp32 AdamW). It is written
atomically and read with ``weights_only=True``. One exception to "no pickles":
Transformer Engine keeps a delayed-scaling module's FP8 metadata (scales, amax
history) in its ``_extra_state`` as a pickle inside a byte tensor, and since TE
2.20 refuses to unpickle it unless ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``.
The checkpoints read here are the ones :func:`save` wrote for the same run (the
study's own output directory), so :func:`restore` opts in for that one
``load_state_dict`` call and puts the variable back afterwards.
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from precsearch.backends.te_optimizer import compact_fp8_states
from precsearch.fp8.scaling import Scaler
from precsearch.probe.measure.events import StepMonitor
from precsearch.probe.result import ProbeResult

_SKIP_SAID: set[Path] = set()  # folders whose skipped checkpoints were reported

#: The per-step records of a :class:`ProbeResult` that a continued leg carries on.
_RECORDS = ("losses", "grad_norms", "fp8_steps", "events", "layer_stats")


@dataclass(frozen=True)
class Leg:
    """One stretch of a longer run (see the module docstring).

    Attributes:
        horizon: Steps the learning-rate schedule is laid out over (>= the leg's own steps).
        resume_from: Checkpoint to continue from, or None to start at step 0.
        save_to: Where to save the state after the leg's last step, or None.
    """

    horizon: int
    resume_from: str | None = None
    save_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Leg | None":
        return cls(**data) if data else None


def schedule_steps(leg: Leg | None, steps: int) -> int:
    """Steps the LR schedule spans: the leg's horizon, or the probe's own ``steps`` without a leg."""
    return max(leg.horizon, steps) if leg is not None else steps


def restore(leg: Leg | None, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
            monitor: StepMonitor, result: ProbeResult) -> int:
    """Load the leg's checkpoint into the freshly built objects; return the first step to run (0 without one)."""
    if leg is None or leg.resume_from is None:
        return 0
    state = torch.load(leg.resume_from, map_location="cpu", weights_only=True)
    with _own_te_extra_state():
        model.load_state_dict(state["model"])
    _load_scalers(model, state["scalers"])
    opt.load_state_dict(state["optimizer"])
    compact_fp8_states(opt)  # FusedAdam re-makes FP8 moments with a transpose on load; keep them one layout
    sched.load_state_dict(state["scheduler"])
    monitor.load_state_dict(state["monitor"])
    torch.set_rng_state(state["rng"]["cpu"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    for name in _RECORDS:
        setattr(result, name, list(state["records"][name]))
    result.start_step = state["step"]
    return state["step"]


def save(leg: Leg | None, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, monitor: StepMonitor,
         result: ProbeResult) -> bool:
    """Write the state after ``len(result.losses)`` steps to ``leg.save_to`` (atomically).

    Returns whether it was written: not without a leg to save, and not when it would leave less than
    :func:`disk_reserve` free on that disk (said on stderr; the next rung then runs from step 0).
    """
    if leg is None or leg.save_to is None:
        return False
    state = {
        "step": len(result.losses),
        "model": model.state_dict(),
        "scalers": _scaler_state(model),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "monitor": monitor.state_dict(),
        "rng": {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "records": {name: list(getattr(result, name)) for name in _RECORDS},
    }
    path = Path(leg.save_to)
    path.parent.mkdir(parents=True, exist_ok=True)
    size, disk = _tensor_bytes(state), shutil.disk_usage(path.parent)
    if size > disk.free - disk_reserve(disk.total):
        if path.parent not in _SKIP_SAID:  # once per folder and process, not once per trial
            _SKIP_SAID.add(path.parent)
            print(f"precsearch: checkpoint {path} not written: it needs {size / 2**30:.1f} GiB and "
                  f"{disk.free / 2**30:.1f} GiB are free (keeping {disk_reserve(disk.total) / 2**30:.1f} GiB); "
                  f"a promotion of this run will train from step 0 (said once for {path.parent})",
                  file=sys.stderr, flush=True)
        return False
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a kill mid-write never leaves half a checkpoint
    return True


def disk_reserve(total: int) -> int:
    """Bytes a checkpoint must leave free: 10% of the disk, at least 2 GiB."""
    return max(2 * 2**30, total // 10)


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


#: Transformer Engine's opt-in to unpickling the FP8 metadata in a module's ``_extra_state``.
TE_UNSAFE_PICKLE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


@contextmanager
def _own_te_extra_state():
    """Let TE read the delayed-scaling metadata of a checkpoint this run wrote (see the module docstring)."""
    before = os.environ.get(TE_UNSAFE_PICKLE_ENV)
    os.environ[TE_UNSAFE_PICKLE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[TE_UNSAFE_PICKLE_ENV]
        else:
            os.environ[TE_UNSAFE_PICKLE_ENV] = before


def _scalers(model: torch.nn.Module):
    """``(module name, attribute, scaler)`` for every FP8 scaler a module holds as an attribute."""
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, Scaler):
                yield name, attr, value


def _scaler_state(model: torch.nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    # a scaler's running state is its private tensors (delayed scaling: _history, _scale)
    return {f"{name}.{attr}": {k: v.detach().cpu() for k, v in vars(scaler).items()
                               if k.startswith("_") and isinstance(v, torch.Tensor)}
            for name, attr, scaler in _scalers(model)}


def _load_scalers(model: torch.nn.Module, states: dict[str, dict[str, torch.Tensor]]) -> None:
    for name, attr, scaler in _scalers(model):
        for key, value in states.get(f"{name}.{attr}", {}).items():
            setattr(scaler, key, value)
