"""Scalers: how each FP8 recipe picks its scales, one stateful object per tensor role.

Every scaler has ``quantize(x) -> Tensor`` that returns the float32
quantize-dequantized tensor and remembers ``last_scale`` (the scale it used),
``last_stats`` (see :func:`~precsearch.fp8.formats.quantization_stats`) and
``last_code_scale``: one factor that turns the whole result into BF16 values (the
codes, times power-of-two block scales), so a GEMM can run on them in BF16 with
FP32 accumulation and scale its output once, as an FP8 tensor core does.

* :class:`DelayedScaler` - per-tensor scale from the amax history of *earlier*
  calls (Transformer Engine ``DelayedScaling``). Stale by design: a tensor that
  grows between steps saturates, which is the failure mode the search measures.
* :class:`CurrentScaler` - per-tensor scale from this tensor's own amax
  (``Float8CurrentScaling``).
* :class:`BlockScaler` - one scale per tile of the last two dims, 1x128 for
  activations and gradients, 128x128 for weights (``Float8BlockScaling``).
* :class:`MXScaler` - 1x32 tiles with power-of-two E8M0 scales (``MXFP8``).
* :class:`RowScaler` - one power-of-two scale per row, E4M3 for every role
  (torchao's ``rowwise`` recipe).
* :class:`NVFP4Scaler` - E2M1 with E4M3 scales per 1x16 (or 16x16) tile and an
  FP32 tensor scale, optional Hadamard transform and stochastic rounding
  (``NVFP4BlockScaling``; the numerics are in :mod:`precsearch.fp8.nvfp4`).

:func:`make_scaler` builds the right one for a layer's recipe and a tensor role: the recipe
(:mod:`precsearch.recipes`) names its family in :data:`SCALERS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple

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
from precsearch.fp8.nvfp4 import NVFP4_BLOCK, hadamard_matrix, nvfp4_quantize, nvfp4_stats, rht
from precsearch.precision import AmaxAlgo, Fp8Format, LayerRecipe
from precsearch.recipes import recipe_for

ROLES = ("input", "weight", "grad_output")
"""The tensors of a Linear layer that get quantized."""

#: The default tiles of :class:`BlockScaler` and block of :class:`MXScaler` (each recipe's own come from its spec).
ACTIVATION_BLOCK = (1, 128)
WEIGHT_BLOCK = (128, 128)
MX_BLOCK = 32


class Scales(NamedTuple):
    """What a scaler picked for one call."""

    compact: Tensor
    """The scale to report: 0-d, or one per block."""
    full: Tensor | None
    """The scale broadcastable to the tensor; None for one scale per tile of the scaler's ``block``."""
    amax: Tensor | None = None
    """``max |x|`` (0-d, or one per block) where the scaler computed it: the cast and the
    history reuse it instead of another pass over the tensor."""


class Scaler(ABC):
    """Chooses scales for one tensor role and quantize-dequantizes with them.

    Attributes:
        fmt: The element format, ``"e4m3"`` or ``"e5m2"``.
        blockwise: True when scales vary along the tensor (so quantizing the
            transpose gives different values, as for a wgrad GEMM).
        track_stats: Compute ``last_stats`` on every call.
        last_scale: The scale of the latest call (0-d, or one per block); None before.
        last_stats: Diagnostics of the latest call; None before.
        last_code_scale: The latest call's code scale (:meth:`code_scale`); None before, or when it has none.
    """

    blockwise: bool = False

    def __init__(self, fmt: str, track_stats: bool = True) -> None:
        format_spec(fmt)  # validate early
        self.fmt = fmt
        self.track_stats = track_stats
        self.last_scale: Tensor | None = None
        self.last_stats: dict[str, Tensor] | None = None
        self.last_code_scale: Tensor | None = None

    @torch.no_grad()
    def quantize(self, x: Tensor) -> Tensor:
        """Quantize-dequantize ``x`` with this scaler's scale; returns float32.

        Not differentiable: meant for use inside an ``autograd.Function``.
        """
        x = x.detach()
        compact, full, amax = self._scales(x)
        if full is None:  # one scale per tile
            out = quantize_blocks(x, compact, self.block, self.fmt, amax)
        else:
            out = quantize_dequantize(x, full, self.fmt, amax)
        self.last_scale = compact
        self.last_code_scale = self.code_scale(compact)
        if self.track_stats:
            full = expand_blocks(compact, self.block, x.shape) if full is None else full
            self.last_stats = quantization_stats(x, full, self.fmt, out)
            if not self.blockwise:
                self.last_stats["scale"] = compact
        self._observe(x, amax)
        return out

    def quantize_columnwise(self, t2d: Tensor) -> Tensor:
        """The operand of a GEMM that reduces over ``t2d``'s first dim (the wgrad GEMM's tokens).

        Blocks then run down the columns. Returns a tensor shaped like ``t2d``
        whose ``.t() @ other`` is the GEMM (subclasses may return it in a rotated
        basis of that dim, the same for both operands).
        """
        return self.quantize(t2d.t()).t()

    @abstractmethod
    def _scales(self, x: Tensor) -> Scales:
        """The scales of this call (and the amax they came from, for the cast to reuse)."""

    def code_scale(self, compact: Tensor) -> Tensor | None:
        """A 0-d ``c`` such that ``quantize``'s result times ``c`` holds BF16 values, given the call's scale.

        A per-tensor scale: the scale itself (the result times it is each element's FP8 code, to within float32
        rounding, and a code has at most 4 significant bits). Power-of-two block scales: 1 (a code times a power
        of two is a BF16 value). Other block scales: None, no such factor exists.
        """
        if not self.blockwise:
            return compact
        return compact.new_ones(()) if getattr(self, "pow2", True) else None

    def _observe(self, x: Tensor, amax: Tensor | None = None) -> None:
        """Update state after quantizing ``x``, whose ``max |x|`` is ``amax`` if known (delayed scaling records it)."""


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

    def _scales(self, x: Tensor) -> Scales:
        amax = _amax(x)
        scale = scale_from_amax(amax, self.fmt, self.margin)
        return Scales(scale, scale, amax)


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

    def _scales(self, x: Tensor) -> Scales:
        if self._scale is None:
            self._scale = torch.ones((), device=x.device)
            self._history = torch.zeros(self.history_len, device=x.device)
        elif self._scale.device != x.device:  # the model moved: keep the state
            self._scale = self._scale.to(x.device)
            self._history = self._history.to(x.device)
        # this call's amax is not used for its scale, only recorded after it (by _observe)
        return Scales(self._scale, self._scale, _amax(x))

    def _observe(self, x: Tensor, amax: Tensor | None = None) -> None:
        # roll so index 0 is the newest entry; the oldest falls off the end
        self._history = torch.roll(self._history, 1)
        self._history[0] = _amax(x) if amax is None else amax
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
    # along each row's tiles first, then down the tiles' rows: a max is exact in any order, and a
    # reduction over the innermost dim is several times faster than one over two dims at once
    a = a.unflatten(-1, (-1, bc)).amax(dim=-1)  # (..., R, C/bc)
    return a if br == 1 else a.unflatten(-2, (-1, br)).amax(dim=-2)  # (..., R/br, C/bc)


def expand_blocks(scale: Tensor, block: tuple[int, int], shape: torch.Size) -> Tensor:
    """Spread per-tile ``scale`` (from :func:`block_amax` layout) back to ``shape``."""
    full = scale.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    rows = shape[-2] if len(shape) >= 2 else 1
    full = full[..., :rows, : shape[-1]]  # drop the padding of ragged tiles
    return full.reshape(shape)


def quantize_blocks(x: Tensor, scale: Tensor, block: tuple[int, int], fmt: str,
                    amax: Tensor | None = None) -> Tensor:
    """``quantize_dequantize(x, expand_blocks(scale, block, x.shape), fmt, amax)``, to the bit.

    Where the tiles divide a 2-d ``x`` laid out row- or column-major, each tile's
    scale is broadcast over a view of the tile instead of being spread over a
    tensor of ``x``'s size first (the same multiply and divide per element).
    """
    if x.dim() == 2 and not x.is_contiguous() and x.t().is_contiguous():  # a wgrad operand's transpose
        return quantize_blocks(x.t(), scale.t(), (block[1], block[0]), fmt, amax).t()
    br, bc = block
    if x.dim() != 2 or not x.is_contiguous() or x.shape[0] % br or x.shape[1] % bc:
        return quantize_dequantize(x, expand_blocks(scale, block, x.shape), fmt, amax)
    tiles = x.view(x.shape[0] // br, br, x.shape[1] // bc, bc)
    return quantize_dequantize(tiles, scale[:, None, :, None], fmt, amax).view(x.shape)


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

    def _scales(self, x: Tensor) -> Scales:
        amax = block_amax(x, self.block)
        scale = scale_from_amax(amax, self.fmt, pow2=self.pow2)
        return Scales(scale, None, amax)


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

    def _scales(self, x: Tensor) -> Scales:
        amax = block_amax(x, self.block)
        scale = e8m0_round_scale(amax, self.fmt, self.rounding)
        return Scales(scale, None, amax)


class RowScaler(Scaler):
    """One scale per row of the last dim, rounded down to a power of two (torchao's rowwise recipe).

    The wgrad operands (:meth:`~Scaler.quantize_columnwise`) are then scaled per column, as the GEMM that reduces
    over tokens needs. ``block`` is ``(1, 0)``: a tile one row high and as wide as the tensor.
    """

    blockwise = True
    block = (1, 0)

    def _scales(self, x: Tensor) -> Scales:
        if x.numel() == 0:
            amax = x.new_zeros((), dtype=torch.float32)
        else:
            amax = x.detach().float().abs().amax(dim=-1, keepdim=True)
        scale = scale_from_amax(amax, self.fmt, pow2=True)
        return Scales(scale, scale, amax)


class NVFP4Scaler(Scaler):
    """NVFP4 (TE ``NVFP4BlockScaling``): E2M1 elements, E4M3 scales per tile, an FP32 tensor scale.

    Args:
        tile: (1, 16) blocks along the reduced dim, or (16, 16) weight tiles
            (then the transpose quantizes to the transposed values).
        hadamard: Rotate the column-wise operand (:meth:`quantize_columnwise`,
            the wgrad GEMM's) with the 16x16 random Hadamard transform first.
        stochastic: Round the E2M1 elements stochastically (gradients).
        seed: Seeds the stochastic-rounding stream (offset by ``torch.initial_seed()``
            when first used; ``build_probe`` seeds torch with the probe's seed, so that seed fixes it).
        track_stats: Compute ``last_stats`` on every call.
    """

    blockwise = True

    def __init__(self, tile: tuple[int, int] = (1, NVFP4_BLOCK), hadamard: bool = False,
                 stochastic: bool = False, seed: int = 0, track_stats: bool = True) -> None:
        if tuple(tile) not in ((1, NVFP4_BLOCK), (NVFP4_BLOCK, NVFP4_BLOCK)):
            raise ValueError(f"NVFP4 tiles are 1x16 or 16x16, got {tile}")
        self.fmt = "e2m1"
        self.track_stats = track_stats
        self.last_scale: Tensor | None = None
        self.last_stats: dict[str, Tensor] | None = None
        self.last_code_scale: Tensor | None = None
        self.block = tuple(tile)
        self.hadamard = hadamard
        self.stochastic = stochastic
        self.seed = seed
        self._generator: torch.Generator | None = None

    def _stream(self, device: torch.device) -> torch.Generator | None:
        if not self.stochastic:
            return None
        if self._generator is None or self._generator.device != device:
            # an unseeded process has a 64-bit initial seed: keep the sum in manual_seed's range
            self._generator = torch.Generator(device).manual_seed((torch.initial_seed() + self.seed) % 2**63)
        return self._generator

    @torch.no_grad()
    def quantize(self, x: Tensor) -> Tensor:
        """Quantize-dequantize ``x`` (blocks along its last dim); returns float32."""
        x = x.detach()
        x2d = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        out, block, s_enc = nvfp4_quantize(x2d, self.block, self.stochastic, self._stream(x.device))
        self.last_scale = block
        # an E2M1 element (2 significant bits) times its E4M3 block scale (4) is a BF16 value: only the FP32
        # tensor scale is left to divide out
        self.last_code_scale = s_enc
        if self.track_stats:
            self.last_stats = nvfp4_stats(x2d, s_enc, block, self.block, out)
        return out.reshape(x.shape)

    def quantize_columnwise(self, t2d: Tensor) -> Tensor:
        """Column-wise blocks, after the Hadamard transform along the first dim when it is on.

        With the transform the result lives in the rotated (and zero-padded to a
        multiple of 16) basis of the first dim: ``(tokens', features)``.
        """
        if not self.hadamard:
            return super().quantize_columnwise(t2d)
        rotated = rht(t2d.t(), hadamard_matrix(device=t2d.device))
        return self.quantize(rotated).t()

    def _scales(self, x: Tensor) -> Scales:
        raise NotImplementedError("NVFP4Scaler quantizes with two scale levels in quantize()")


def make_nvfp4_scaler(recipe: LayerRecipe, role: str, seed: int = 0) -> NVFP4Scaler:
    """NVFP4 per role as TE's recipe sets it: 2D tiles for weights, RHT for input and
    gradient (wgrad operands), stochastic rounding for gradients, each switchable."""
    if role == "weight":
        tile = (NVFP4_BLOCK, NVFP4_BLOCK) if recipe.nvfp4_2d_weights else (1, NVFP4_BLOCK)
        return NVFP4Scaler(tile)
    stochastic = role == "grad_output" and recipe.nvfp4_stochastic_rounding
    return NVFP4Scaler((1, NVFP4_BLOCK), hadamard=recipe.nvfp4_rht, stochastic=stochastic, seed=seed)


def role_format(fp8_format: Fp8Format | str, role: str) -> str:
    """The element format a role uses: E5M2 only for gradients under HYBRID."""
    if role not in ROLES:
        raise ValueError(f"unknown tensor role {role!r}; valid: {', '.join(ROLES)}")
    hybrid = Fp8Format(fp8_format) is Fp8Format.HYBRID
    return E5M2 if (hybrid and role == "grad_output") else E4M3


def make_scaler(recipe: LayerRecipe, role: str, seed: int = 0) -> Scaler:
    """The scaler for one tensor ``role`` ("input", "weight", "grad_output") of a layer.

    Args:
        recipe: The layer's recipe.
        role: The tensor role.
        seed: Seeds the stochastic rounding of NVFP4 gradients (give each layer its own).

    Raises:
        ValueError: For a BF16 recipe (nothing to quantize) or an unknown role.
    """
    role_format(recipe.fp8_format, role)  # an unknown role fails first, whatever the precision
    family = recipe_for(recipe.precision).emulation
    if family is None:
        raise ValueError(f"precision {recipe.precision.value!r} needs no FP8 scaler")
    return SCALERS[family](recipe, role, seed)


def _block(recipe: LayerRecipe, role: str) -> tuple[int, int]:
    spec = recipe_for(recipe.precision).spec
    return spec.weight_block if role == "weight" else spec.activation_block


#: A recipe's :attr:`~precsearch.recipes.base.Recipe.emulation` -> its scaler for (layer recipe, role, seed).
SCALERS: dict[str, Callable[[LayerRecipe, str, int], Scaler]] = {
    "delayed": lambda r, role, seed: DelayedScaler(role_format(r.fp8_format, role), r.amax_history_len,
                                                   r.amax_compute_algo, r.margin),
    "current": lambda r, role, seed: CurrentScaler(role_format(r.fp8_format, role)),
    "block": lambda r, role, seed: BlockScaler(role_format(r.fp8_format, role), _block(r, role)),
    "mx": lambda r, role, seed: MXScaler(role_format(r.fp8_format, role), _block(r, role)[1]),
    "two_level_fp4": lambda r, role, seed: make_nvfp4_scaler(r, role, seed),
    "row": lambda r, role, seed: RowScaler(E4M3),  # E4M3 for every role, gradients too
}
