"""The BF16 reference probe, run once per fingerprint and cached on disk.

A trial is compared with a BF16 probe of the same model, data order, init
seed, steps and gradient-clipping threshold (and the baseline's optimizer
memory settings, ``objectives.baseline_memory``), so the loss gap isolates what
the precision changed. The reference depends on nothing else, so it is run
once per distinct key and read back from ``<output>/references/<key>.json``.

A trial's reference is a set (:class:`References`): the BF16 probe at seeds
``probe.seed .. probe.seed + objectives.reference_seeds - 1``, whose spread is
the noise floor, and, with ``objectives.stress``, one at the stress learning
rate. Only the model's initial weights change with the seed: the data order
and the held-out batches stay the space's, so every seed is scored on the
same held-out loss, and the spread is what initialisation alone moves.
Each member is cached under its own key.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from precsearch.config.space import ProbeSection, Space
from precsearch.errors import UserError
from precsearch.probe.result import ProbeResult
from precsearch.search.scoring import measure_noise_floor

#: Bump when the probe loop changes what a reference measures.
RUNNER_VERSION = 4  # 2: per-step events recorded; 4: Megatron-Core layout on TE fused modules, fused AdamW on GPU


def reference_key(space: Space, clip_grad: float | None, device: torch.device,
                  probe: ProbeSection | None = None) -> str:
    """A short fingerprint of everything the BF16 reference depends on.

    ``probe`` overrides ``space.probe`` (another seed, the stress learning rate).
    """
    probe = probe or space.probe
    payload = {
        "model": space.model.probe().__dict__ | {"rope_scaling": str(space.model.probe().rope_scaling)},
        "data": space.data.model_dump(mode="json"),
        "probe": probe.model_dump(mode="json", exclude={"device"}),
        "clip_grad": clip_grad,
        "baseline_memory": space.objectives.baseline_memory.model_dump(mode="json"),
        "device": device.type,
        "torch": torch.__version__,
        "runner": RUNNER_VERSION,
    }
    blob = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ReferenceCache:
    """References on disk, keyed by :func:`reference_key`; safe for several local processes at once."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._memory: dict[str, ProbeResult] = {}

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
        with open(self.directory / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
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


#: Runs the BF16 reference probe with a probe section; the string labels it for progress output.
RunReference = Callable[[ProbeSection, str], ProbeResult]


@dataclass(frozen=True)
class References:
    """The BF16 references a trial is scored against.

    Attributes:
        seeds: One per reference seed, ``probe.seed`` first (the one a trial is paired with).
        stress: The BF16 probe at the stress learning rate, or None without stress.
    """

    seeds: list[ProbeResult]
    stress: ProbeResult | None = None

    @property
    def paired(self) -> ProbeResult:
        """The reference of the trial's own seed."""
        return self.seeds[0]

    @property
    def noise_floor(self) -> float:
        """The seeds' relative spread of held-out loss (NaN with one seed)."""
        return measure_noise_floor(self.seeds)


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
                      run: RunReference) -> References:
    """Every BF16 reference a trial with ``clip_grad`` needs, from ``cache`` or run once each."""
    seeds = []
    for probe in seed_probes(space):
        key = reference_key(space, clip_grad, device, probe)
        label = "BF16 reference" if probe.seed == space.probe.seed else f"BF16 reference (seed {probe.seed})"
        seeds.append(cache.get(key, lambda p=probe, lb=label: run(p, lb)))
    stressed = stress_probe(space)
    stress = None
    if stressed is not None:
        stress = cache.get(reference_key(space, clip_grad, device, stressed),
                           lambda: run(stressed, "BF16 reference (stress)"), field="objectives.stress.lr_multiplier")
    return References(seeds=seeds, stress=stress)
