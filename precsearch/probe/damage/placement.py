"""Where the BF16 run's states are kept between readings, for ``objectives.damage.keep_states: auto``.

On a CPU they go to disk (:func:`disk_fits`), where the spill directory's free space takes them and they
would hold more than :data:`HOST_SMALL_BYTES` in memory; else host memory (a small model's states cost
nothing to hold, and reading them from disk costs time). Host memory is where a CPU probe computes, so
states kept there are held beside every later trial (24 bytes a unit weight per state, 4x the BF16 model's
2 a parameter for two states alone); on disk nothing is held between trials and a reading reads them back
a slice at a time (:mod:`.spill`), to the same figures.

On the accelerator a reading copies nothing and the BF16 side needs no page-locked host memory, whose
allocation is most of its cost on a GPU (on the H200 at the 8B space: the first BF16 side took 30.7 s with
its 2 x 17.6 GiB of states page-locked, 5.7 s with them on the device; docs/stability-reading.md). But the
states stay there for the rest of the study, beside every later trial, reading and clipping value's states.

:func:`states_fit` keeps a clipping value's states on the device when everything held then, plus a margin
for the work still to come, fits in 90% of the device's memory:

    held now + these states + their BF16 gradients + 1.25 x working set  <=  0.9 x device memory

The working set is the larger of the BF16 run the states come from (FP32 parameters and AdamW moments, as
the memory model predicts it) and the largest peak a probe of this process reached since its last reset
(the trial just run), less what was held then. Each clipping value is placed when its BF16 side is made,
so a second one goes to the host when the first filled the device: on an H200 at the 8B space the first
clipping value's states go to the device and the second's to the host; on an 80 GB H100 both to the host.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from precsearch.arch.units import unit_names, unit_shape
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.recipes import DEFAULT_PRECISION
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.model.llama3 import ModelConfig

#: Of the device's memory, what held bytes and the working set may take together.
DEVICE_SHARE = 0.9
#: The working set's margin (allocator rounding, the reading's own temporaries).
MARGIN = 1.25
FP32_BYTES = 4
PARAM_BYTES = {"fp32": 4, "bf16": 2}
#: Of the spill directory's free space, what ``auto`` lets a clipping value's files take on a CPU.
DISK_SHARE = 0.5
#: States and BF16 gradients ``auto`` keeps in a CPU's memory rather than on disk: at or below this, holding
#: them costs nothing a machine would notice (the CPU quickstart's are a few MiB), and disk costs time.
HOST_SMALL_BYTES = 256 * 2**20
#: A policy's gradient's bytes per element at most (FP32: emulated FP8 GEMM outputs are not BF16 values).
POLICY_GRAD_BYTES = 4
#: A kept BF16-side gradient's bytes per element (BF16: :func:`precsearch.probe.damage.reading.kept_grad`).
GRAD_BYTES = 2


def state_bytes(cfg: ModelConfig, n_states: int) -> int:
    """Bytes of ``n_states`` states: every parameter in FP32, and two FP32 moments of each unit weight."""
    return n_states * FP32_BYTES * (cfg.num_params() + 2 * unit_elements(cfg))


def gradient_bytes(cfg: ModelConfig, probe: ProbeSection, settings: DamageSection, n_states: int) -> int:
    """Bytes of the BF16 side's gradients kept at ``n_states`` states: each unit's, per reading batch, in BF16
    whatever the probe's parameter dtype (BF16 autocast's weight gradients are BF16 values, kept in BF16 by
    :func:`.reading.kept_grad`)."""
    return n_states * settings.batches * GRAD_BYTES * unit_elements(cfg)


def bf16_run_peak(cfg: ModelConfig, probe: ProbeSection) -> int:
    """The memory model's peak of the BF16 run the states come from (FP32 parameters, standard AdamW)."""
    bf16 = {unit: DEFAULT_PRECISION for unit in unit_names(cfg)}
    return predict_peak(cfg, bf16, seq_len=probe.seq_len, micro_batch=probe.micro_batch, param_dtype="fp32",
                        grad_accum=probe.grad_accum).total


def states_fit(cfg: ModelConfig, probe: ProbeSection, settings: DamageSection, device: torch.device,
               n_states: int, held: int, *, total: int | None = None, peak: int | None = None) -> bool:
    """True when ``n_states`` states (and their BF16 gradients) fit on ``device`` beside ``held`` bytes already
    kept there and the working set (module docstring); always False on a CPU, where there is no copy to save.

    ``total`` and ``peak`` (the device's memory, the process's peak since its last reset) are read from the
    device unless given.
    """
    if device.type != "cuda":
        return False
    total = torch.cuda.get_device_properties(device).total_memory if total is None else total
    peak = torch.cuda.max_memory_allocated(device) if peak is None else peak
    working = max(bf16_run_peak(cfg, probe), peak - held)
    need = held + state_bytes(cfg, n_states) + gradient_bytes(cfg, probe, settings, n_states) + MARGIN * working
    return need <= DEVICE_SHARE * total


def unit_elements(cfg: ModelConfig) -> int:
    """The weight elements of every searchable unit (Linear layer) of ``cfg``, summed.

    The reading's per-unit copies (its kept gradients, a state's two Adam moments) scale with this count.
    """
    return sum(rows * cols for rows, cols in (unit_shape(cfg, unit) for unit in unit_names(cfg)))


def where_states(cfg: ModelConfig, probe: ProbeSection, settings: DamageSection, device: torch.device,
                 n_states: int, held: int, directory: str | Path | None = None) -> str:
    """Where a clipping value's states go: ``settings.keep_states``, or for ``auto`` ``device`` where
    :func:`states_fit` says so (an accelerator), ``disk`` on a CPU where the states and BF16 gradients would hold
    more than :data:`HOST_SMALL_BYTES` and :func:`disk_fits` says so, else ``host``."""
    if settings.keep_states != "auto":
        return settings.keep_states
    if device.type == "cpu":
        held = state_bytes(cfg, n_states) + gradient_bytes(cfg, probe, settings, n_states)
        small = held <= HOST_SMALL_BYTES
        return "disk" if not small and disk_fits(cfg, probe, settings, n_states, directory) else "host"
    return "device" if states_fit(cfg, probe, settings, device, n_states, held) else "host"


def disk_bytes(cfg: ModelConfig, probe: ProbeSection, settings: DamageSection, n_states: int) -> int:
    """Bytes a clipping value writes to disk at most: its states, its BF16 gradients and, while one state of a
    policy is read, that policy's gradients there (FP32)."""
    policy = settings.batches * POLICY_GRAD_BYTES * unit_elements(cfg)
    return state_bytes(cfg, n_states) + gradient_bytes(cfg, probe, settings, n_states) + policy


def disk_fits(cfg: ModelConfig, probe: ProbeSection, settings: DamageSection, n_states: int,
              directory: str | Path | None = None, *, free: int | None = None) -> bool:
    """True when :func:`disk_bytes` take at most :data:`DISK_SHARE` of ``directory``'s free space (None: the
    temporary directory; ``free``, in bytes, is read from it unless given)."""
    if free is None:
        free = shutil.disk_usage(directory or tempfile.gettempdir()).free
    return disk_bytes(cfg, probe, settings, n_states) <= DISK_SHARE * free
