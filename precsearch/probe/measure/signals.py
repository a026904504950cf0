"""Early-warning signals of late FP8 instability, measured on a probe's stat steps.

The definitions, and why each is read this way, are in ``signals.md`` beside this module. In short, with
every trend fitted over the last ``tail`` share of the run (the second half by default: the early loss
descent moves every statistic and says nothing about late stability) and given per 100 steps:

* ``amax_growth``: least-squares slope of ``ln amax`` per tensor (block outputs, FP8 operands), max over tensors.
* ``kurtosis``: of each decoder block's output, per token over channels, averaged over tokens; max over blocks.
* ``alignment``: mean over neurons of ``|cos(gate_j, up_j)|`` of each SwiGLU ``linear_fc1``; max over blocks.
* ``attention_logit``: max causal attention logit (:mod:`~precsearch.probe.measure.attention_logit`); max over blocks.
* ``grad_norm_trend``: Theil-Sen slope of ``ln`` grad norm (robust to single spikes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

PER = 100
"""Trends are given per this many steps."""

Series = list[tuple[int, float]]


#: A trend needs the points it is fitted over to span at least this many steps: two points a step apart
#: (the last stat steps of a short probe) would be extrapolated to 100 steps from one step's noise.
MIN_TREND_SPAN = 10


def tail(points: Series, fraction: float) -> Series:
    """The points in the last ``fraction`` of the step range (all of them for ``fraction`` 1)."""
    if not points:
        return []
    first, last = points[0][0], points[-1][0]
    start = last - fraction * (last - first)
    return [(s, v) for s, v in points if s >= start]


def trend(points: Series, fraction: float, *, log: bool = False, robust: bool = False) -> float:
    """:func:`slope` over the last ``fraction`` of ``points``; NaN (not measured) when those points span
    fewer than :data:`MIN_TREND_SPAN` steps."""
    last = tail(points, fraction)
    if not last or last[-1][0] - last[0][0] < MIN_TREND_SPAN:
        return math.nan
    return slope(last, log=log, robust=robust)


def slope(points: Series, *, log: bool = False, robust: bool = False) -> float:
    """Slope per :data:`PER` steps of ``value`` (or ``ln value``), least squares or Theil-Sen (``robust``).

    Non-finite values (and non-positive ones under ``log``) are skipped; NaN with fewer than two steps left.
    """
    kept = [(s, math.log(v) if log else v) for s, v in points if math.isfinite(v) and (v > 0 or not log)]
    x, y = np.array([s for s, _ in kept], dtype=float), np.array([v for _, v in kept], dtype=float)
    if len(np.unique(x)) < 2:
        return math.nan
    if robust:
        return PER * _theil_sen(x, y)
    return PER * float(np.polyfit(x, y, 1)[0])


def _theil_sen(x: np.ndarray, y: np.ndarray, most: int = 1000) -> float:
    """Median of pairwise slopes, over at most ``most`` evenly spaced points (pairs grow as n^2)."""
    if len(x) > most:
        pick = np.linspace(0, len(x) - 1, most).round().astype(int)
        x, y = x[pick], y[pick]
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    ok = dx != 0
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))


def token_kurtosis(x: Tensor, max_tokens: int = 4096) -> Tensor:
    """Kurtosis over the last (channel) dim per token, averaged over tokens; a Gaussian gives 3.

    ``E[(x - mu)^4] / E[(x - mu)^2]^2`` with population moments. Any layout with channels last works
    (``(B, T, D)`` or Megatron's ``(T, B, D)``); at most ``max_tokens`` evenly strided tokens are used.
    Returns a 0-d float32 tensor on ``x``'s device (no host sync).
    """
    rows = x.detach().reshape(-1, x.shape[-1])
    rows = rows[:: max(1, math.ceil(rows.shape[0] / max_tokens))].float()
    centred = rows - rows.mean(dim=-1, keepdim=True)
    var = centred.square().mean(dim=-1)
    fourth = centred.square().square().mean(dim=-1)
    return (fourth / var.square().clamp_min(1e-30)).mean()


def gate_up_alignment(weight: Tensor, chunk: int = 4096) -> tuple[Tensor, Tensor]:
    """Mean and max over neurons of ``|cos(gate_j, up_j)|`` of a fused SwiGLU ``fc1`` weight.

    Args:
        weight: ``(2 * ffn, dim)``, rows ``[0, ffn)`` gate and ``[ffn, 2 * ffn)`` up (Megatron's
            ``linear_fc1.weight``, TE ``LayerNormMLP.fc1_weight``: ``silu(first half) * second half``).
        chunk: Neurons per pass (bounds the float32 copy).

    Returns:
        0-d float32 tensors ``(mean |cos|, max |cos|)`` on the weight's device.
    """
    weight = _plain(weight)
    if weight.dim() != 2 or weight.shape[0] % 2:
        raise ValueError(f"a fused gate/up weight must be (2 * ffn, dim), got {tuple(weight.shape)}")
    ffn = weight.shape[0] // 2
    cosines = []
    for start in range(0, ffn, chunk):
        gate = weight[start:min(start + chunk, ffn)].float()
        up = weight[ffn + start:ffn + min(start + chunk, ffn)].float()
        norms = (gate.norm(dim=1) * up.norm(dim=1)).clamp_min(1e-30)
        cosines.append(((gate * up).sum(dim=1) / norms).abs())
    every = torch.cat(cosines)
    return every.mean(), every.amax()


def _plain(weight: Tensor) -> Tensor:
    """A plain tensor: FSDP2 shards gathered (a collective: every rank must call), FP8 weights dequantized."""
    weight = weight.detach()
    if hasattr(weight, "full_tensor"):
        weight = weight.full_tensor()
    if type(weight) is not Tensor and hasattr(weight, "dequantize"):  # TE Float8Tensor, torchao's float8 weights
        weight = weight.dequantize()
    return weight


@dataclass(frozen=True)
class Signals:
    """One run's early-warning signals (see the module docstring); NaN where a signal was not measured.

    Attributes:
        amax_growth: Max over tensors of the slope of ``ln amax`` per 100 steps.
        amax_growth_at: The tensor it belongs to (``block.3.output``, ``layers.0.attn.qkv:input``).
        kurtosis: Block-output kurtosis at the last stat step, max over blocks.
        kurtosis_growth: Slope of ``ln`` of that (max over blocks) per 100 steps.
        kurtosis_block: The block holding the last maximum (-1: none).
        alignment: Mean over neurons of ``|cos(gate, up)|`` at the last stat step, max over blocks.
        alignment_max: Max over neurons and blocks of ``|cos(gate, up)|`` at the last stat step.
        alignment_growth: Slope of ``alignment`` per 100 steps.
        alignment_block: The block holding the last maximum (-1: none).
        attention_logit: Max causal attention logit at the last stat step, max over blocks.
        attention_logit_growth: Its slope per 100 steps.
        attention_logit_block: The block holding the last maximum (-1: none).
        grad_norm_trend: Theil-Sen slope of ``ln`` grad norm per 100 steps.
        fp8_amax_growth: As ``amax_growth``, over the FP8 operands (from the diagnostics); a BF16
            run has none, so this is reported, not compared: ``amax_growth`` reads only tensors
            both runs have (block outputs), or the risk score would compare unlike sets.
        fp8_amax_growth_at: The FP8 operand it belongs to (``<unit>:<role>``).
        block_amax_at: The block output whose amax grew most over the whole run (peak over its first stat
            step's; no trend fit, so a probe too short for ``amax_growth`` still has it); its series is
            ``block_amax``. Read by the regime check (:mod:`precsearch.probe.regime`).
        series: Per signal, ``(step, value)`` over the run, for plots: ``amax`` (of the tensor named in
            ``amax_growth_at``), ``block_amax`` (of ``block_amax_at``), ``kurtosis``, ``alignment``,
            ``attention_logit`` (max over blocks), ``grad_norm``.
    """

    amax_growth: float = math.nan
    amax_growth_at: str = ""
    kurtosis: float = math.nan
    kurtosis_growth: float = math.nan
    kurtosis_block: int = -1
    alignment: float = math.nan
    alignment_max: float = math.nan
    alignment_growth: float = math.nan
    alignment_block: int = -1
    attention_logit: float = math.nan
    attention_logit_growth: float = math.nan
    attention_logit_block: int = -1
    grad_norm_trend: float = math.nan
    fp8_amax_growth: float = math.nan
    fp8_amax_growth_at: str = ""
    block_amax_at: str = ""
    series: dict[str, Series] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (series as lists of ``[step, value]``)."""
        return asdict(self) | {"series": {k: [list(p) for p in v] for k, v in self.series.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Signals:
        """Inverse of :meth:`to_dict`."""
        series = {k: [(int(s), float(v)) for s, v in points] for k, points in data.get("series", {}).items()}
        return cls(**(data | {"series": series}))


History = dict[str, dict[str, dict[int, float]]]
"""Signal kind -> item (block index or tensor name) -> step -> value."""


def per_step_max(items: dict[str, dict[int, float]]) -> tuple[Series, str]:
    """Max over items at each step (NaN-propagating), and the item holding it at the last step."""
    steps = sorted({s for values in items.values() for s in values})
    series, holder = [], ""
    for step in steps:
        here = {item: values[step] for item, values in items.items() if step in values}
        holder = max(here, key=lambda item: (math.isnan(here[item]), here[item]))
        series.append((step, here[holder]))
    return series, holder


def summarise(history: History, fraction: float = 0.5) -> Signals:
    """:class:`Signals` from a recorded history (:class:`~precsearch.probe.measure.signal_recorder.SignalRecorder`)."""
    fields: dict[str, Any] = {}
    series: dict[str, Series] = {}
    for kind, prefix in (("amax", "amax"), ("fp8_amax", "fp8_amax")):
        amax = {item: sorted(v.items()) for item, v in history.get(kind, {}).items()}
        growth = {item: trend(points, fraction, log=True) for item, points in amax.items()}
        finite = {item: g for item, g in growth.items() if not math.isnan(g)}
        if finite:
            fields[f"{prefix}_growth_at"] = worst = max(finite, key=finite.__getitem__)
            fields[f"{prefix}_growth"], series[kind] = finite[worst], amax[worst]
    blocks = {item: sorted(v.items()) for item, v in history.get("amax", {}).items() if item.startswith("block.")}
    if runs := {item: _run_growth(points) for item, points in blocks.items()}:
        fields["block_amax_at"] = worst = max(runs, key=runs.__getitem__)
        series["block_amax"] = blocks[worst]
    for kind, log in (("kurtosis", True), ("alignment", False), ("attention_logit", False)):
        if history.get(kind):
            points, holder = per_step_max(history[kind])
            series[kind] = points
            fields |= {kind: points[-1][1], f"{kind}_growth": trend(points, fraction, log=log),
                       f"{kind}_block": int(holder)}
    if history.get("alignment_max"):
        fields["alignment_max"] = per_step_max(history["alignment_max"])[0][-1][1]
    if history.get("grad_norm"):
        series["grad_norm"] = points = sorted(history["grad_norm"]["model"].items())
        fields["grad_norm_trend"] = trend(points, fraction, log=True, robust=True)
    return Signals(**fields, series=series)


def _run_growth(points: Series) -> float:
    """Peak over first value of a positive series (0 when it has no finite positive start)."""
    values = [v for _, v in points if math.isfinite(v) and v > 0]
    return max(values) / values[0] if values else 0.0


def grad_norm_trend(grad_norms: Sequence[float], fraction: float = 0.5) -> float:
    """Theil-Sen slope of ``ln`` grad norm per 100 steps over the last ``fraction`` of a per-step list."""
    return slope(tail(list(enumerate(map(float, grad_norms))), fraction), log=True, robust=True)
