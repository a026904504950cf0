"""FP8 diagnostics per layer: what each FP8 tensor looked like, and where a diverging probe went bad.

Two things are recorded while a probe trains:

* **Per-layer FP8 statistics** (:class:`TensorStats`), for every FP8 layer
  and tensor role (``input`` activation, ``weight``, ``grad_output``): the
  absolute max, the per-tensor scale in use (None for block/MX recipes, whose
  scales vary along the tensor), the share of finite values that saturation
  clipped (``overflow``: scaled magnitude beyond the format's max by more than
  half a step), the share of non-zero values that came back zero
  (``underflow``) and the count of NaN/inf values. The backend computes them in
  its quantize path (:meth:`~precsearch.backends.base.Backend.layer_stats`).
  They cost extra elementwise passes over every FP8 operand (about 40% of an
  emulated step on CPU), so they are **collected every** ``every`` **steps**
  (:class:`DiagnosticsConfig`, default 10: steps 0, 10, 20, ...) **and at the
  last step**, and switched off in between. Only steps where FP8 is on produce
  any (the BF16 warm-up quantizes nothing).
* **Sentinels** on every precision unit, FP8 or not, on the step that
  diverged: a forward hook counts the non-finite values of the unit's input
  and output, a hook on the output's gradient counts those of
  ``grad_output``, and a hook on the weight counts those of its gradient
  (``grad_weight``). They are not installed on ordinary steps (each costs an
  extra pass over a tensor and a few kernel launches per unit, several
  percent of a step at the 8B width): when a step's loss or gradient comes
  back non-finite, the optimizer step is skipped, so the weights are still
  those the step started from, and the probe **replays** that step once with
  the sentinels installed (:meth:`LayerWatch.replay`). The replay sees the same
  weights and batch; a delayed-scaling recipe's scales have moved by one
  update since (they recorded the bad step's amax), so its replay can differ.

When a probe diverges, :meth:`LayerWatch.explain` names the first offender
(:class:`FirstBad`):

1. If the diverging step produced a non-finite value: the first one in the
   replay's execution order (forward, then backward), i.e. a unit whose input
   arrived non-finite (so a non-Linear op upstream produced it), whose FP8
   operand was non-finite (on a collection step), whose output was, whose
   output gradient was, or whose weight gradient was.
2. Otherwise (a loss blow-up with every value finite): the earliest collected
   FP8 operand whose overflow share passed ``saturation_limit``, in execution
   order within its step. Its step is a collection step, so the onset is known
   to within ``every`` steps; ``every=1`` gives the exact step.
3. With neither, nothing is named.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from precsearch.backends.tensor_stats import LayerStats, TensorStats  # noqa: F401 - re-exported
from precsearch.fp8.scaling import ROLES

if TYPE_CHECKING:
    from precsearch.backends.base import Backend

#: After which sentinel an FP8 layer's quantized operands are checked: it quantizes its input and
#: weight once its input arrived, and its gradient once the gradient of its output arrived.
_FP8_ROLES_AT = {"input": ("input", "weight"), "grad_output": ("grad_output",)}


@dataclass(frozen=True)
class DiagnosticsConfig:
    """How often FP8 statistics are collected, and what counts as saturating.

    Attributes:
        every: Collect per-layer FP8 statistics every this many steps (and at the last step).
        saturation_limit: An FP8 operand with a larger overflow share counts as saturating
            (0.001: one value in a thousand clipped).
        sentinels: ``replay`` (default): non-finite sentinels only on a replay of a step whose
            loss or gradient came back non-finite; ``every_step``: on every step (costs a pass over
            every unit's input, output and gradients; kept to measure that cost, ``benchmarks/bench_stack.py``).
    """

    every: int = 10
    saturation_limit: float = 0.001
    sentinels: str = "replay"

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"diagnostics 'every' must be >= 1 step, got {self.every}")
        if not 0 <= self.saturation_limit < 1:
            raise ValueError(f"diagnostics 'saturation_limit' must be in [0, 1), got {self.saturation_limit}")
        if self.sentinels not in ("replay", "every_step"):
            raise ValueError(f"diagnostics 'sentinels' must be replay or every_step, got {self.sentinels!r}")

    def collects(self, step: int, steps: int) -> bool:
        """True when ``step`` of a ``steps``-step probe is a collection step."""
        return step % self.every == 0 or step == steps - 1


def stats_rows(step: int, stats: LayerStats, precisions: dict[str, str]) -> list[dict[str, Any]]:
    """Flat rows (one per layer and role) for :attr:`ProbeResult.layer_stats`."""
    return [
        {"step": step, "layer": layer, "role": role, "precision": precisions.get(layer, "")}
        | asdict(roles[role])
        for layer, roles in stats.items()
        for role in ROLES
        if role in roles
    ]


@dataclass(frozen=True)
class FirstBad:
    """The first layer and tensor that went bad in a diverging probe.

    Attributes:
        step: The step it happened at (a collection step for a saturation found in the history).
        layer: Fully qualified Linear name.
        tensor: ``input``, ``output``, ``weight``, ``grad_output`` or ``grad_weight``.
        kind: ``nonfinite`` or ``overflow``.
        value: The count of non-finite values, or the overflow share.
    """

    step: int
    layer: str
    tensor: str
    kind: str
    value: float

    def describe(self) -> str:
        """One line for the divergence reason."""
        if self.kind == "nonfinite":
            what = f"{int(self.value)} non-finite value(s) in {self.tensor}"
        else:
            what = f"{100 * self.value:.2f}% of {self.tensor} saturated"
        return f"first bad layer {self.layer}: {what} at step {self.step}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_saturated(rows: list[dict[str, Any]], names: list[str], limit: float) -> FirstBad | None:
    """The earliest row (of :func:`stats_rows`) whose overflow share passed ``limit``, or None.

    Within a step, in execution order: inputs and weights in forward order
    (``names`` order), then gradients in backward (reverse) order.
    """
    order = {n: i for i, n in enumerate(names)}

    def executed(row: dict[str, Any]) -> tuple:
        i = order.get(row["layer"], len(order))
        backward = row["role"] == "grad_output"
        return row["step"], backward, -i if backward else i, ROLES.index(row["role"])

    for row in sorted(rows, key=executed):
        if row["overflow"] > limit:
            return FirstBad(row["step"], row["layer"], row["role"], "overflow", row["overflow"])
    return None


def _unit_module(model: nn.Module, name: str) -> tuple[str, nn.Module]:
    """The module computing unit ``name``; a unit fused into its parent (TE ``LayerNormMLP``) gives the parent."""
    try:
        return name, model.get_submodule(name)
    except AttributeError:
        parent = name.rpartition(".")[0]
        return parent, model.get_submodule(parent)


def _nonfinite_count(t: Tensor) -> Tensor:
    return torch.isfinite(t.detach()).logical_not().sum()


class LayerWatch:
    """Sentinels on a probe's precision units (on a replayed step) and the per-step FP8 statistics.

    Args:
        model: The converted probe model (a ``torch.compile`` wrapper gets no
            sentinels: hooks would break its graph; statistics are still collected).
        backend: The backend that converted it (it computes the FP8 statistics).
        names: The units to watch (``unit_names`` of the probe), in execution order.
        config: Collection interval and saturation limit.
        steps: The probe's length (its last step is always collected).
    """

    def __init__(self, model: nn.Module, backend: Backend, names: list[str], config: DiagnosticsConfig,
                 steps: int) -> None:
        self.model, self.backend, self.config, self.steps = model, backend, config, steps
        self.names = list(names)
        self.precisions = {n: p.value for n, p in backend.converted_layers(model).items()}
        self._events: list[tuple[str, str, Tensor]] = []
        self._stats: LayerStats = {}
        self._handles: list[Any] = []
        if config.sentinels == "every_step":
            self._install_all()

    def _install_all(self) -> None:
        if hasattr(self.model, "_orig_mod"):
            return
        seen: set[int] = set()
        for name in self.names:
            label, module = _unit_module(self.model, name)
            if id(module) not in seen:
                seen.add(id(module))
                self._install(label, module)

    def replay(self, step: int, run: Any) -> None:
        """Run ``run()`` (the diverged step's forward and backward again) with the sentinels installed.

        With ``sentinels: every_step`` the step itself was watched: nothing is replayed.
        """
        if self._handles or hasattr(self.model, "_orig_mod"):
            return
        self._events.clear()
        self._install_all()
        self.backend.track_stats(self.model, True)  # the replay's FP8 operands are checked too
        try:
            run()
            self._stats = self.backend.layer_stats(self.model)
        finally:
            self.backend.track_stats(self.model, False)
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def _install(self, name: str, module: nn.Module) -> None:
        def forward_hook(_module: nn.Module, args: tuple, output: Tensor) -> None:
            self._events.append((name, "input", _nonfinite_count(args[0])))
            self._events.append((name, "output", _nonfinite_count(output)))
            if output.requires_grad:
                output.register_hook(lambda grad: self._record(name, "grad_output", grad))

        self._handles.append(module.register_forward_hook(forward_hook))
        weight = getattr(module, "weight", None)
        if isinstance(weight, Tensor) and weight.requires_grad:
            self._handles.append(weight.register_hook(lambda grad: self._record(name, "grad_weight", grad)))

    def _record(self, name: str, tensor: str, grad: Tensor) -> None:
        self._events.append((name, tensor, _nonfinite_count(grad)))

    def begin_step(self, step: int) -> None:
        """Forget the previous step's sentinels; switch FP8 statistics on for a collection step."""
        self._events.clear()
        self._stats = {}
        self.backend.track_stats(self.model, self.config.collects(step, self.steps))

    def end_step(self, rows: list[dict[str, Any]], step: int) -> None:
        """Append this step's FP8 statistics to ``rows`` if it was a collection step."""
        if self.config.collects(step, self.steps):
            self._stats = self.backend.layer_stats(self.model)
            rows.extend(stats_rows(step, self._stats, self.precisions))

    def explain(self, step: int, rows: list[dict[str, Any]]) -> FirstBad | None:
        """The first offender of a probe that diverged at ``step`` (see the module docstring)."""
        return self._first_nonfinite(step) or self._first_saturated(rows)

    def _first_nonfinite(self, step: int) -> FirstBad | None:
        """This step's sentinels in execution order; an FP8 layer's operands are checked where it cast them."""
        if not self._events:
            return None
        counts = torch.stack([c.to("cpu") for _, _, c in self._events]).tolist()  # one host sync
        for (layer, tensor, _), count in zip(self._events, counts):
            if count:
                return FirstBad(step, layer, tensor, "nonfinite", float(count))
            for role in _FP8_ROLES_AT.get(tensor, ()):
                s = self._stats.get(layer, {}).get(role)
                if s is not None and s.nonfinite:
                    return FirstBad(step, layer, role, "nonfinite", float(s.nonfinite))
        return None

    def _first_saturated(self, rows: list[dict[str, Any]]) -> FirstBad | None:
        return first_saturated(rows, self.names, self.config.saturation_limit)

    def close(self) -> None:
        """Remove any hook left and switch FP8 statistics off."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._events.clear()
        self.backend.track_stats(self.model, False)
