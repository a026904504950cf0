"""The BF16 reference probe, run once per fingerprint and cached on disk.

A trial is compared with a BF16 probe of the same model, data order, init
seed, steps and gradient-clipping threshold (and the baseline's optimizer
memory settings, ``objectives.baseline_memory``), so the loss gap isolates what
the precision changed. The reference depends on nothing else, so it is run
once per distinct key and read back from ``<output>/references/<key>.json``.

A trial's reference is a set (:class:`References`): the BF16 probe at seeds
``probe.seed .. probe.seed + objectives.reference_seeds - 1``, whose spread is
the noise floor, and, with ``objectives.stress``, one at the stress learning
rate. Only the model's initial weights change with the seed (or, for a probe
started from a checkpoint, which has no random init, the training data order):
the held-out batches stay the space's, so every seed is scored on the
same held-out loss, and the spread is what initialisation alone moves.
Each member is cached under its own key.

With fidelity rungs (``study.fidelity``), each seed's reference is a run laid
out over the longest rung, cut at every rung: the reference of a rung continues
the previous rung's reference from its checkpoint (``<key>.pt`` beside its
JSON), exactly as the trials it is compared with continue theirs. If that
checkpoint is missing (deleted, or another machine's output directory), the
rung is run from step 0 instead: the same run, only slower. The stress
reference is not cut into rungs (promoted trials keep their first-rung stress
verdict).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from precsearch import cpu_bf16
from precsearch.config.space import ObjectivesSection, ProbeSection, Space
from precsearch.errors import UserError
from precsearch.probe.continuation import Leg
from precsearch.probe.result import ProbeResult
from precsearch.search.scoring import measure_noise_floor

#: Bump when the probe loop changes what a reference measures.
RUNNER_VERSION = 5  # 2: per-step events recorded; 4: Megatron-Core layout on TE fused modules, fused AdamW on GPU;
# 5: CPU BF16 Linear layers without native BF16 run float32 GEMMs on BF16 operands (precsearch.cpu_bf16)


def reference_key(space: Space, clip_grad: float | None, device: torch.device,
                  probe: ProbeSection | None = None, horizon: int | None = None) -> str:
    """A short fingerprint of everything the BF16 reference depends on.

    ``probe`` overrides ``space.probe`` (another seed, the stress learning rate, a rung's
    steps); ``horizon`` is the length the LR schedule is laid out over, when not ``probe.steps``.
    """
    probe = probe or space.probe
    payload = {
        "model": space.model.probe().__dict__ | {"rope_scaling": str(space.model.probe().rope_scaling)},
        "data": space.data.model_dump(mode="json"),
        # grad_accum 1 is left out: references cached before accumulation existed keep their keys
        "probe": probe.model_dump(mode="json", exclude={"device"} | ({"grad_accum"} if probe.grad_accum == 1
                                                                     else set())),
        "clip_grad": clip_grad,
        "baseline_memory": space.objectives.baseline_memory.model_dump(mode="json"),
        "device": device.type,
        "torch": torch.__version__,
        "runner": RUNNER_VERSION,
    }
    if device.type == "cpu":  # native BF16 GEMMs or float32 ones round differently (precsearch.cpu_bf16)
        payload["cpu_bf16_gemms"] = cpu_bf16.gemm_path()
    if space.model.init_from is not None:  # absent for a random init: those cached references keep their keys
        start = space.model.start()
        payload["init_from"] = {"path": str(start.path.resolve()), "layers": list(start.layers)}
    if horizon is not None:  # absent for a study without rungs: its cached references keep their keys
        payload["horizon"] = horizon
    blob = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ReferenceCache:
    """References on disk, keyed by :func:`reference_key`; safe for several local processes at once."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._memory: dict[str, ProbeResult] = {}

    def checkpoint(self, key: str) -> Path:
        """Where the reference of ``key`` saves its state for the next rung to continue."""
        return self.directory / f"{key}.pt"

    def get(self, key: str, run: Callable[[], ProbeResult], field: str = "probe.lr") -> ProbeResult:
        """The cached reference for ``key``, running ``run()`` once if there is none.

        Raises:
            UserError: naming ``field`` (the setting to lower) if the BF16 probe diverged.
        """
        if key in self._memory:
            return self._memory[key]
        path = self.directory / f"{key}.json"
        self.directory.mkdir(parents=True, exist_ok=True)
        # Parallel workers sharing this directory run each reference once: the first takes the lock
        # and runs it, the others wait and read its file.
        with FileLock(self.directory / f"{key}.lock"):
            if path.exists():
                result = ProbeResult.from_dict(json.loads(path.read_text()))
            else:
                result = run()
                if result.diverged:
                    raise UserError(f"the BF16 reference probe diverged ({result.reason}); lower it", field=field)
                self._write(path, result)
        self._memory[key] = result
        return result

    def _write(self, path: Path, result: ProbeResult) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_dict()))
        os.replace(tmp, path)  # atomic: a crash never leaves half a reference


#: Runs the BF16 reference probe with a probe section, a label for progress output, and the leg of a
#: longer run it is (None outside fidelity rungs).
RunReference = Callable[[ProbeSection, str, Leg | None], ProbeResult]


@dataclass(frozen=True)
class References:
    """The BF16 references a trial is scored against.

    Attributes:
        seeds: One per reference seed, ``probe.seed`` first (the one a trial is paired with).
        stress: The BF16 probe at the stress learning rate, or None without stress.
        standard: The standard FP8 recipe's fixed-state reading at the trial's clipping value
            (:mod:`precsearch.runtime.standard`), or None where the study reads none.
    """

    seeds: list[ProbeResult]
    stress: ProbeResult | None = None
    standard: dict[str, Any] | None = None

    @property
    def paired(self) -> ProbeResult:
        """The reference of the trial's own seed."""
        return self.seeds[0]

    @property
    def noise_floor(self) -> float:
        """The seeds' relative spread of held-out loss (NaN with one seed)."""
        return measure_noise_floor(self.seeds)

    def noise_floor_in(self, objectives: ObjectivesSection) -> float:
        """The seeds' relative spread of the loss ``objectives.reading`` reads (NaN with one seed)."""
        return measure_noise_floor(self.seeds, objectives.reading, objectives.tail_fraction)


def seed_probes(space: Space) -> list[ProbeSection]:
    """The probe section of each reference seed, ``probe.seed`` first."""
    first, count = space.probe.seed, space.objectives.reference_seeds
    return [space.probe.model_copy(update={"seed": first + i}) for i in range(count)]


def stress_probe(space: Space) -> ProbeSection | None:
    """The probe section at the stress learning rate (``lr x objectives.stress.lr_multiplier``), or None."""
    multiplier = space.objectives.stress.lr_multiplier
    if multiplier is None:
        return None
    return space.probe.model_copy(update={"lr": space.probe.lr * multiplier})


def gather_references(space: Space, cache: ReferenceCache, device: torch.device, clip_grad: float | None,
                      run: RunReference, steps: int | None = None) -> References:
    """Every BF16 reference a trial with ``clip_grad`` needs, from ``cache`` or run once each.

    ``steps`` is the trial's rung (default: ``probe.steps``); with ``study.fidelity`` each seed's
    reference is continued rung by rung up to it.
    """
    seeds = []
    for probe in seed_probes(space):
        label = "BF16 reference" if probe.seed == space.probe.seed else f"BF16 reference (seed {probe.seed})"
        if space.study.fidelity is None:
            seeds.append(cache.get(reference_key(space, clip_grad, device, probe),
                                   lambda p=probe, lb=label: run(p, lb, None)))
        else:
            seeds.append(_rung_reference(space, cache, device, clip_grad, probe, steps or probe.steps, run, label))
    stressed = stress_probe(space)
    stress = None
    if stressed is not None:
        stress = cache.get(reference_key(space, clip_grad, device, stressed),
                           lambda: run(stressed, "BF16 reference (stress)", None),
                           field="objectives.stress.lr_multiplier")
    return References(seeds=seeds, stress=stress)


def _rung_reference(space: Space, cache: ReferenceCache, device: torch.device, clip_grad: float | None,
                    probe: ProbeSection, steps: int, run: RunReference, label: str) -> ProbeResult:
    """The reference of ``probe`` at rung ``steps``, each earlier rung first (each continues the one before)."""
    horizon = space.study.fidelity.horizon
    previous: Path | None = None
    result = None
    for rung in (r for r in space.study.fidelity.rungs if r <= steps):
        leg_probe = probe.model_copy(update={"steps": rung})
        key = reference_key(space, clip_grad, device, leg_probe, horizon=horizon)
        leg = Leg(horizon=horizon, resume_from=str(previous) if previous and previous.exists() else None,
                  save_to=str(cache.checkpoint(key)) if rung < horizon else None)
        result = cache.get(key, lambda p=leg_probe, lg=leg: run(p, f"{label}, {rung} steps", lg))
        previous = cache.checkpoint(key)
    return result


def uncached_steps(space: Space, cache: ReferenceCache, device: torch.device) -> int:
    """Steps of the BF16 reference probes the study may still run (the ETA's share of references).

    Every clipping value the space offers (a range: its two ends), every seed and the stress probe,
    at the first rung with ``study.fidelity``; those already in ``cache`` count nothing.
    """
    members = seed_probes(space) + ([stressed] if (stressed := stress_probe(space)) is not None else [])
    fidelity = space.study.fidelity
    steps = 0
    for clip_grad in space.search.clip_grad.options():
        for probe in members:
            if fidelity is not None and probe is not stressed:
                probe = probe.model_copy(update={"steps": fidelity.rungs[0]})
            horizon = fidelity.horizon if fidelity is not None and probe is not stressed else None
            if not (cache.directory / f"{reference_key(space, clip_grad, device, probe, horizon)}.json").exists():
                steps += probe.steps
    return steps
