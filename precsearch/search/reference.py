"""The BF16 reference probe, run once per fingerprint and cached on disk.

A trial is compared with a BF16 probe of the same model, data order, init
seed, steps and gradient-clipping threshold (and the baseline's optimizer
memory settings, ``objectives.baseline_memory``), so the loss gap isolates what
the precision changed. The reference depends on nothing else, so it is run
once per distinct key and read back from ``<output>/references/<key>.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.probe.result import ProbeResult

#: Bump when the probe loop changes what a reference measures.
RUNNER_VERSION = 1


def reference_key(space: Space, clip_grad: float | None, device: torch.device) -> str:
    """A short fingerprint of everything the BF16 reference depends on."""
    payload = {
        "model": space.model.probe().__dict__ | {"rope_scaling": str(space.model.probe().rope_scaling)},
        "data": space.data.model_dump(mode="json"),
        "probe": space.probe.model_dump(mode="json", exclude={"device"}),
        "clip_grad": clip_grad,
        "baseline_memory": space.objectives.baseline_memory.model_dump(mode="json"),
        "device": device.type,
        "torch": torch.__version__,
        "runner": RUNNER_VERSION,
    }
    blob = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ReferenceCache:
    """References on disk, keyed by :func:`reference_key`."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._memory: dict[str, ProbeResult] = {}

    def get(self, key: str, run: Callable[[], ProbeResult]) -> ProbeResult:
        """The cached reference for ``key``, running ``run()`` once if there is none."""
        if key in self._memory:
            return self._memory[key]
        path = self.directory / f"{key}.json"
        if path.exists():
            result = ProbeResult.from_dict(json.loads(path.read_text()))
        else:
            result = run()
            if result.diverged:
                raise UserError(f"the BF16 reference probe diverged ({result.reason}); lower it", field="probe.lr")
            self._write(path, result)
        self._memory[key] = result
        return result

    def _write(self, path: Path, result: ProbeResult) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_dict()))
        os.replace(tmp, path)  # atomic: a crash never leaves half a reference
