"""One unit's compare step of the fixed-state reading: four float64 Gram matrices over the K batches.

For one precision unit at one state (:mod:`.reading`), the K batches' gradients
of both sides give four families of K vectors, each the unit's size: the BF16
gradients ``g``, the errors ``e = p - g``, the baseline updates ``u``
(:class:`.update.UnitStep`) and the policy's update errors ``ue``. Everything
the reading reports is a function of their Gram matrices (:mod:`.gram`).

The unit is streamed in ``chunk``-element slices of its flattened tensors. Per
slice, :func:`chunk_rows` stacks the families asked for into one float64 block
(one row per batch and family) whose ``X X^T`` is added into the unit's matrix
on the device; the matrix is read back once per unit. So the step's temporaries
are a few K x chunk blocks, whatever the unit's size.

Two things make it cheap on an accelerator:

* **the BF16 families once per state.** ``g`` and ``u`` do not depend on the
  policy: :func:`baseline_grams` computes their matrices once (the reader keeps
  them with the BF16 side), and a policy's compare then builds only ``e`` and
  ``ue`` (``base=``);
* **one fused kernel per slice.** :func:`chunk_rows` is a chain of elementwise
  operations (the two AdamW updates, the errors, the casts), each a full pass
  over K x chunk floats when run op by op. On CUDA it is compiled with
  ``torch.compile`` (``objectives.damage.compile_compare``), which fuses the
  chain into a few kernels that read the gradients once and write the block
  once; the scalars (step, learning rate, betas) are arguments, so the states of
  a study share one compiled kernel; the BF16/FP16 storages round by integer
  arithmetic (:mod:`.rounding`), which no compiler folds away as it may a cast
  round trip. Compiled figures equal the op-by-op ones to
  float32 rounding of the updates (a fused multiply-add is rounded once), not to
  the bit; on a CPU the op-by-op chain runs, bit for bit the whole-tensor
  reference (``tests/probe/damage_reference.py``).

A state kept in host memory is copied a slice at a time; on CUDA the next slice
is copied on a side stream while the current one is computed
(:class:`StateSlices`). A state or gradients kept on disk (:mod:`.spill`) are
read a slice at a time the same way: the compare never holds a whole unit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from precsearch.probe.damage import gram
from precsearch.probe.damage.update import MOMENTS, SCALED, Storage, StepDtypes, UnitStep

log = logging.getLogger(__name__)

#: Elements of a unit compared at once on an accelerator: a few K x CHUNK blocks are the compare step's
#: temporaries (K = 4: 256 MiB per float32 block), whatever the unit's size.
CHUNK = 2**24
#: The same on a CPU, where blocks that fit the caches (and the allocator's reuse) are 3-4x faster than 2**24
#: (bench_damage_compare.py@6f05340); the figures do not depend on the chunk but by float64 summation order.
CPU_CHUNK = 2**18

#: The four Gram matrices of a unit, by name; ``BASE`` those of the BF16 side (the same for every policy at a
#: state), ``POLICY`` those a policy's compare computes.
GRAMS = ("g", "e", "u", "ue")
BASE = ("g", "u")
POLICY = ("e", "ue")

#: A unit's step arguments: (0-based step, learning rate, betas, weight decay).
StepArgs = tuple[int, float, tuple[float, float], float]


def default_chunk(device: torch.device) -> int:
    """:data:`CPU_CHUNK` on a CPU, else :data:`CHUNK`."""
    return CPU_CHUNK if device.type == "cpu" else CHUNK


def chunk_rows(g: list[Tensor], p: list[Tensor], w: Tensor, m0: Tensor, m1: Tensor, dtypes: StepDtypes,
               amax: dict[str, Tensor], landed_amax: Tensor | None, step: int, lr: float, beta1: float,
               beta2: float, weight_decay: float, families: tuple[str, ...]) -> Tensor:
    """The float64 rows of one slice: for each name in ``families`` (of :data:`GRAMS`), its K rows, in order.

    ``g`` and ``p`` are the K batches' gradient slices of the two sides (any float dtype), ``w``, ``m0``, ``m1``
    the state's weight and moments there (float32, on the same device). ``amax`` holds the whole tensors'
    amaxes the scaled storages need (:meth:`.update.StepDtypes.scaled`), ``landed_amax`` the per-batch amax of
    ``before + update`` for a scaled ``keep`` (else None). Pure and elementwise, so :func:`compiled_rows` can
    fuse it; the scalars are plain arguments so that a compiled kernel serves every state.
    """
    unit = UnitStep(dtypes, (step, lr, (beta1, beta2), weight_decay), amax)
    m = (m0, m1)
    gs = torch.stack(g).float()
    rows: dict[str, Tensor] = {"g": gs}
    if "u" in families or "ue" in families:
        rows["u"] = unit.baseline(w, gs, m)
    if "e" in families or "ue" in families:
        ps = torch.stack(p).float()
        rows["e"] = ps - gs
        if "ue" in families:
            landed = None if landed_amax is None else Storage(dtypes.keep, landed_amax)
            rows["ue"] = unit.applied(w, ps, m, landed) - rows["u"]
    return torch.cat([rows[name] for name in families]).double()


#: Inductor's options for the compiled chunk. ``emulate_precision_casts`` keeps eager's rounding of low-precision
#: intermediates and turns off fused multiply-adds. It does not keep a ``.to(bfloat16).float()`` round trip on
#: every torch: on the H200 (torch 2.11) the compiled chunk did not round BF16 moments or a BF16/FP16 kept weight
#: with it set, so the storages round by integer arithmetic instead (:mod:`.rounding`).
COMPILE_OPTIONS = {"emulate_precision_casts": True}

_compiled: dict[str, Callable] = {}


def compiled_rows(device: torch.device, enabled: bool = True) -> Callable:
    """:func:`chunk_rows`, compiled with ``torch.compile`` on CUDA when ``enabled`` (once per process; shapes
    and scalars dynamic), else itself. A compile that fails falls back to the op-by-op function, with a
    warning, for the rest of the process (see :func:`rows_for`)."""
    if not enabled or device.type != "cuda":
        return chunk_rows
    if "cuda" not in _compiled:
        _compiled["cuda"] = torch.compile(chunk_rows, dynamic=True, options=COMPILE_OPTIONS)
    return _compiled["cuda"]


def rows_for(device: torch.device, enabled: bool = True) -> Callable:
    """The chunk function for ``device`` that falls back to :func:`chunk_rows` if the compiled one raises."""
    fn = compiled_rows(device, enabled)
    if fn is chunk_rows:
        return fn

    def guarded(*args, **kwargs):
        if _compiled.get("failed"):
            return chunk_rows(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # inductor missing a compiler, an unsupported op: the eager chain is the same math
            _compiled["failed"] = exc
            log.warning("compiled compare step failed (%s: %s); comparing op by op from here on",
                        type(exc).__name__, exc)
            return chunk_rows(*args, **kwargs)

    return guarded


def compile_failure() -> BaseException | None:
    """The exception that made the compiled compare fall back in this process (None: it did not)."""
    return _compiled.get("failed")


class StateSlices:
    """A state's flattened weight and two moments, a slice at a time on ``device``.

    Tensors already on ``device`` are sliced. Host tensors (pinned) are copied: on CUDA on a side stream, one
    slice ahead of the one being computed, so the copy of slice i + 1 overlaps the compute of slice i; the
    compute stream waits for each slice's copy before using it. ``moments`` None (a state before the first
    step) gives zeros.
    """

    def __init__(self, weight: Tensor, moments: tuple[Tensor, Tensor] | None, device: torch.device):
        self.tensors = [weight.reshape(-1), *(() if moments is None else (m.reshape(-1) for m in moments))]
        self.device = device
        on_host = any(t.device != device and t.device.type == "cpu" for t in self.tensors)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" and on_host else None

    def _fetch(self, span: slice) -> list[Tensor]:
        return [t[span].to(self.device, non_blocking=True) for t in self.tensors]

    def _complete(self, parts: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        if len(parts) == 1:
            zeros = torch.zeros_like(parts[0])
            return parts[0], zeros, zeros
        return parts[0], parts[1], parts[2]

    def __call__(self, spans: list[slice]) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(weight, exp_avg, exp_avg_sq)`` slices on ``device``, one per span, in order."""
        if self.stream is None:
            for span in spans:
                yield self._complete(self._fetch(span))
            return
        compute = torch.cuda.current_stream(self.device)

        def ahead(span: slice) -> tuple[list[Tensor], torch.cuda.Event]:
            with torch.cuda.stream(self.stream):
                parts = self._fetch(span)
                done = torch.cuda.Event()
                done.record(self.stream)
            return parts, done

        pending = ahead(spans[0])
        for i in range(len(spans)):
            parts, done = pending
            compute.wait_event(done)
            for t in parts:  # used on the compute stream: not reused by the side stream's pool before it is done
                t.record_stream(compute)
            if i + 1 < len(spans):
                pending = ahead(spans[i + 1])
            yield self._complete(parts)


def compare_unit(g: list[Tensor], p: list[Tensor], weight: Tensor, moments: tuple[Tensor, Tensor] | None,
                 dtypes: StepDtypes, args: StepArgs, device: torch.device, chunk: int | None = None, *,
                 base: dict[str, Tensor] | None = None, compile_compare: bool = True) -> dict[str, Tensor]:
    """One unit's four float64 Gram matrices (host), over its K batches: of the BF16 gradients ``g``, the errors
    ``e = p - g``, the baseline updates ``u`` and the policy's update errors ``ue``.

    Any of the tensors may be on disk (:class:`.spill.SpilledTensor`, ``keep_states: disk``): each slice is then
    read as it is needed. ``base`` (``g`` and ``u`` from :func:`baseline_grams` at the same state) skips those
    two families.
    One pass over ``chunk``-element slices of the flattened unit (None: :func:`default_chunk`), each slice's
    rows from :func:`chunk_rows` (compiled on CUDA unless ``compile_compare`` is off) added into one Gram matrix
    on the device, read back once. A storage with a per-tensor scale (FP8 moments, an FP16 master) first takes
    the whole tensor's amax in a pass of its own, the max over the slices (exact); an FP16 master also rounds
    each batch's ``before + update`` with that sum's amax, taken in one more pass before the Gram pass.
    """
    families = POLICY if base is not None else GRAMS
    out = _grams(g, p, weight, moments, dtypes, args, device, chunk, families, compile_compare)
    return out | ({key: base[key] for key in BASE} if base is not None else {})


def baseline_grams(g: list[Tensor], weight: Tensor, moments: tuple[Tensor, Tensor] | None, args: StepArgs,
                   device: torch.device, chunk: int | None = None, *, compile_compare: bool = True
                   ) -> dict[str, Tensor]:
    """The BF16 side's two Gram matrices of one unit at a state (``g``, ``u``): the same for every policy."""
    baseline = StepDtypes("fp32", "fp32", "fp32")
    return _grams(g, g, weight, moments, baseline, args, device, chunk, BASE, compile_compare)


def _grams(g: list[Tensor], p: list[Tensor], weight: Tensor, moments: tuple[Tensor, Tensor] | None,
           dtypes: StepDtypes, args: StepArgs, device: torch.device, chunk: int | None,
           families: tuple[str, ...], compile_compare: bool) -> dict[str, Tensor]:
    chunk = chunk or default_chunk(device)
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 element, got {chunk}")
    k = len(g)
    g = [t.reshape(-1) for t in g]
    p = [t.reshape(-1) for t in p]
    n = weight.numel()
    spans = [slice(start, min(start + chunk, n)) for start in range(0, n, chunk)]
    state = StateSlices(weight, moments, device)
    step_no, lr, (beta1, beta2), weight_decay = args
    scalars = (step_no, lr, beta1, beta2, weight_decay)

    amax = _amax(state, spans, dtypes.scaled()) if "ue" in families else {}
    landed_amax = None
    if "ue" in families and dtypes.keep in SCALED:  # per batch, the amax of the whole before + update
        unit = UnitStep(dtypes, (step_no, lr, (beta1, beta2), weight_decay), amax)
        for span, (w, m0, m1) in zip(spans, state(spans)):
            a = unit.landed_amax(w, torch.stack(_slices(p, span, device)).float(), (m0, m1))
            landed_amax = a if landed_amax is None else torch.maximum(landed_amax, a)

    rows = rows_for(device, compile_compare)
    acc = torch.zeros(len(families) * k, len(families) * k, dtype=torch.float64, device=device)
    for span, (w, m0, m1) in zip(spans, state(spans)):
        block = rows(_slices(g, span, device), _slices(p, span, device), w, m0, m1, dtypes, amax, landed_amax,
                     *scalars, families)
        gram.gram_of_stacked(block, acc)
        del block
    acc = gram.symmetric(acc).cpu()  # the unit's one host sync
    return {name: acc[i * k:(i + 1) * k, i * k:(i + 1) * k].clone() for i, name in enumerate(families)}


def _slices(tensors: list, span: slice, device: torch.device) -> list[Tensor]:
    """Each flattened tensor's ``span`` on ``device``: a slice of a tensor there, or read from disk
    (:class:`.spill.SpilledTensor`) and moved there."""
    return [t[span].to(device) for t in tensors]


def _amax(state: StateSlices, spans: list[slice], scaled: tuple[str, ...]) -> dict[str, Tensor]:
    """The amax of each whole tensor in ``scaled`` (``weight``, ``exp_avg``, ``exp_avg_sq``), the max over the
    slices; zero moments (a state before the first step): 0."""
    if not scaled:
        return {}
    names = ("weight", *MOMENTS)
    best: dict[str, Tensor] = {}
    for parts in state(spans):
        for name, t in zip(names, parts):
            if name in scaled:
                a = t.abs().max()
                best[name] = a if name not in best else torch.maximum(best[name], a)
    return best
