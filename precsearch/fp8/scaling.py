"""Scalers: how each FP8 recipe picks its scales, one stateful object per tensor role.

Every scaler has ``quantize(x) -> Tensor`` that returns the float32
quantize-dequantized tensor and remembers ``last_scale`` (the scale it used) and
``last_stats`` (see :func:`~precsearch.fp8.formats.quantization_stats`).

* :class:`DelayedScaler` - per-tensor scale from the amax history of *earlier*
  calls (Transformer Engine ``DelayedScaling``). Stale by design: a tensor that
  grows between steps saturates, which is the failure mode the search measures.
* :class:`CurrentScaler` - per-tensor scale from this tensor's own amax
  (``Float8CurrentScaling``).
* :class:`BlockScaler` - one scale per tile of the last two dims, 1x128 for
  activations and gradients, 128x128 for weights (``Float8BlockScaling``).
* :class:`MXScaler` - 1x32 tiles with power-of-two E8M0 scales (``MXFP8``).

:func:`make_scaler` builds the right one for a layer's recipe and a tensor role.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor

from precsearch.fp8.formats import (
    E4M3,
    E5M2,
    e8m0_round_scale,
    format_spec,
    quantization_stats,
    quantize_dequantize,
    scale_from_amax,
)
from precsearch.precision import AmaxAlgo, Fp8Format, LayerRecipe, Precision

ROLES = ("input", "weight", "grad_output")
"""The tensors of a Linear layer that get quantized."""

ACTIVATION_BLOCK = (1, 128)
WEIGHT_BLOCK = (128, 128)
MX_BLOCK = 32


class Scaler(ABC):
    """Chooses scales for one tensor role and quantize-dequantizes with them.

    Attributes:
        fmt: The element format, ``"e4m3"`` or ``"e5m2"``.
        blockwise: True when scales vary along the tensor (so quantizing the
            transpose gives different values, as for a wgrad GEMM).
        track_stats: Compute ``last_stats`` on every call.
        last_scale: The scale of the latest call (0-d, or one per block); None before.
        last_stats: Diagnostics of the latest call; None before.
    """

    blockwise: bool = False

    def __init__(self, fmt: str, track_stats: bool = True) -> None:
        format_spec(fmt)  # validate early
        self.fmt = fmt
        self.track_stats = track_stats
        self.last_scale: Tensor | None = None
        self.last_stats: dict[str, Tensor] | None = None

    @torch.no_grad()
    def quantize(self, x: Tensor) -> Tensor:
        """Quantize-dequantize ``x`` with this scaler's scale; returns float32.

        Not differentiable: meant for use inside an ``autograd.Function``.
        """
        x = x.detach()
        compact, full = self._scales(x)
        out = quantize_dequantize(x, full, self.fmt)
        self.last_scale = compact
        if self.track_stats:
            self.last_stats = quantization_stats(x, full, self.fmt, out)
            if not self.blockwise:
                self.last_stats["scale"] = compact
        self._observe(x)
        return out

    @abstractmethod
    def _scales(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(compact scale to report, scale broadcastable to ``x``) for this call."""

    def _observe(self, x: Tensor) -> None:
        """Update state after quantizing ``x`` (delayed scaling records its amax)."""


def _amax(x: Tensor) -> Tensor:
    """max |x| as a 0-d float32 tensor (0 for an empty tensor; NaN propagates)."""
    if x.numel() == 0:
        return x.new_zeros((), dtype=torch.float32)
    return x.detach().abs().amax().float()


class CurrentScaler(Scaler):
    """Per-tensor scale from the tensor's own amax: ``max / amax / 2**margin``."""

    def __init__(self, fmt: str, margin: int = 0, track_stats: bool = True) -> None:
        super().__init__(fmt, track_stats)
        self.margin = margin

    def _scales(self, x: Tensor) -> tuple[Tensor, Tensor]:
        scale = scale_from_amax(_amax(x), self.fmt, self.margin)
        return scale, scale


class DelayedScaler(Scaler):
    """Per-tensor scale from the amax history of previous calls (TE ``DelayedScaling``).

    Each call quantizes with the current scale, then pushes the tensor's amax
    into a rolling history of ``history_len`` entries and recomputes the scale
    for the next call from it (max of the history or its newest entry). Before
    any history the scale is 1. If the reduced amax is zero or non-finite the
    previous scale is kept.
    """

    def __init__(
        self,
        fmt: str,
        history_len: int = 1024,
        algo: AmaxAlgo | str = AmaxAlgo.MAX,
        margin: int = 0,
        track_stats: bool = True,
    ) -> None:
        super().__init__(fmt, track_stats)
        if history_len < 1:
            raise ValueError("history_len must be >= 1")
        self.history_len = history_len
        self.algo = AmaxAlgo(algo)
        self.margin = margin
        self._history: Tensor | None = None  # newest first; created on first use
        self._scale: Tensor | None = None

    @property
    def scale(self) -> Tensor:
        """The scale the next call will use (1.0 before any history)."""
        return self._scale if self._scale is not None else torch.ones(())

    @property
    def amax_history(self) -> Tensor:
        """The recorded amaxes, newest first, zero-padded to ``history_len``."""
        if self._history is None:
            return torch.zeros(self.history_len)
        return self._history.clone()

    def _scales(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self._scale is None:
            self._scale = torch.ones((), device=x.device)
            self._history = torch.zeros(self.history_len, device=x.device)
        elif self._scale.device != x.device:  # the model moved: keep the state
            self._scale = self._scale.to(x.device)
            self._history = self._history.to(x.device)
        return self._scale, self._scale

    def _observe(self, x: Tensor) -> None:
        # roll so index 0 is the newest entry; the oldest falls off the end
        self._history = torch.roll(self._history, 1)
        self._history[0] = _amax(x)
        amax = self._history[0] if self.algo is AmaxAlgo.MOST_RECENT else self._history.max()
        usable = torch.isfinite(amax) & (amax > 0)
        new = scale_from_amax(amax, self.fmt, self.margin)
        self._scale = torch.where(usable, new, self._scale)


def block_amax(x: Tensor, block: tuple[int, int]) -> Tensor:
    """Absolute max of each ``block`` tile over the last two dims of ``x``.

    A 1-d ``x`` is treated as one row. Ragged edges are zero-padded, which
    leaves every tile's max unchanged.

    Returns:
        Shape ``(..., ceil(rows / block[0]), ceil(cols / block[1]))``.
    """
    br, bc = block
    a = x.detach().float().abs()
    a = a if a.dim() >= 2 else a.unsqueeze(0)
    rows, cols = a.shape[-2:]
    a = F.pad(a, (0, -cols % bc, 0, -rows % br))
    a = a.unflatten(-1, (-1, bc)).unflatten(-3, (-1, br))  # (..., R/br, br, C/bc, bc)
    return a.amax(dim=(-3, -1))


def expand_blocks(scale: Tensor, block: tuple[int, int], shape: torch.Size) -> Tensor:
    """Spread per-tile ``scale`` (from :func:`block_amax` layout) back to ``shape``."""
    full = scale.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    rows = shape[-2] if len(shape) >= 2 else 1
    full = full[..., :rows, : shape[-1]]  # drop the padding of ragged tiles
    return full.reshape(shape)


class BlockScaler(Scaler):
    """One scale per tile of the last two dims (TE ``Float8BlockScaling``).

    Args:
        fmt: Element format.
        block: Tile shape: (1, 128) for activations and gradients, (128, 128)
            for weights. Ragged tails get a tile of their own.
        pow2: Round scales down to powers of two (TE's default for this recipe).
    """

    blockwise = True

    def __init__(
        self, fmt: str, block: tuple[int, int] = ACTIVATION_BLOCK, pow2: bool = True,
        track_stats: bool = True,
    ) -> None:
        super().__init__(fmt, track_stats)
        self.block = tuple(block)
        self.pow2 = pow2

    def _scales(self, x: Tensor) -> tuple[Tensor, Tensor]:
        scale = scale_from_amax(block_amax(x, self.block), self.fmt, pow2=self.pow2)
        return scale, expand_blocks(scale, self.block, x.shape)


class MXScaler(Scaler):
    """MX scaling: 1 x ``block`` tiles along the last dim, power-of-two E8M0 scales.

    Args:
        fmt: Element format.
        block: Tile length (32 in MXFP8).
        rounding: How the shared exponent is picked, see
            :func:`~precsearch.fp8.formats.e8m0_round_scale`: ``"up"`` as
            Transformer Engine does (no saturation), ``"ocp"`` as the OCP spec
            writes it (block maxima in (448, 512) saturate).
    """

    blockwise = True

    def __init__(
        self, fmt: str, block: int = MX_BLOCK, rounding: str = "up", track_stats: bool = True
    ) -> None:
        super().__init__(fmt, track_stats)
        if rounding not in ("up", "ocp"):
            raise ValueError(f"unknown E8M0 rounding {rounding!r}; valid: up, ocp")
        self.block = (1, block)
        self.rounding = rounding

    def _scales(self, x: Tensor) -> tuple[Tensor, Tensor]:
        scale = e8m0_round_scale(block_amax(x, self.block), self.fmt, self.rounding)
        return scale, expand_blocks(scale, self.block, x.shape)


def role_format(fp8_format: Fp8Format | str, role: str) -> str:
    """The element format a role uses: E5M2 only for gradients under HYBRID."""
    if role not in ROLES:
        raise ValueError(f"unknown tensor role {role!r}; valid: {', '.join(ROLES)}")
    hybrid = Fp8Format(fp8_format) is Fp8Format.HYBRID
    return E5M2 if (hybrid and role == "grad_output") else E4M3


def make_scaler(recipe: LayerRecipe, role: str) -> Scaler:
    """The scaler for one tensor ``role`` ("input", "weight", "grad_output") of a layer.

    Raises:
        ValueError: For a BF16 recipe (nothing to quantize) or an unknown role.
        NotImplementedError: For NVFP4, which is not emulated yet.
    """
    fmt = role_format(recipe.fp8_format, role)
    p = recipe.precision
    if p is Precision.FP8_DELAYED:
        return DelayedScaler(
            fmt, recipe.amax_history_len, recipe.amax_compute_algo, recipe.margin
        )
    if p is Precision.FP8_CURRENT:
        return CurrentScaler(fmt)
    if p is Precision.FP8_BLOCK:
        return BlockScaler(fmt, WEIGHT_BLOCK if role == "weight" else ACTIVATION_BLOCK)
    if p is Precision.MXFP8:
        return MXScaler(fmt)
    if p is Precision.NVFP4:
        raise NotImplementedError("NVFP4 emulation is not implemented yet")
    raise ValueError(f"precision {p.value!r} needs no FP8 scaler")
