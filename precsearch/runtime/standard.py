"""The standard FP8 recipe's reading, once per clipping value per study: the point each trial's reading is set beside.

With ``objectives.damage.standard_reference`` (on by default) a study read at fixed states also reads the standard
FP8 recipe (:mod:`precsearch.probe.damage.standard`: Megatron-Core's default delayed scaling on every block Linear,
BF16 output layer, the baseline's optimizer state) at the same states and batches, in the probe process, after the
first trial of each clipping value has made the BF16 side there. It is kept as the BF16 references are: in
``references/<key>.json`` (:class:`~precsearch.runtime.reference.ReferenceCache`, whose lock lets one of several
workers read it), so a resumed study, or another worker, reads it from disk instead of again. Each trial's score
then carries it and its reading's multiple of it (:func:`precsearch.search.scoring.score`).

A reading that fails (its probe process crashed or raised) is said once and left out: the trials of that clipping
value show no multiple, never a made-up one; a later run of the study tries it again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch

from precsearch.config.space import Space
from precsearch.instability import number
from precsearch.probe.result import ProbeResult
from precsearch.readings import get_reading
from precsearch.recipes import STANDARD_FP8_NAME as STANDARD_NAME
from precsearch.redact import first_line
from precsearch.runtime.executor import ProbeCrashed, ProbeFailed
from precsearch.runtime.reference import ReferenceCache, reference_key

#: Bump when the standard recipe, or what its reading stores, changes.
STANDARD_VERSION = 1
#: The reading's settings that change no figure of it: where its tensors live, the limit it is judged against, and
#: the switch that asks for it.
_NOT_FIGURES = {"keep_states", "limit", "standard_reference"}


def standard_key(space: Space, clip_grad: float | None, device: torch.device) -> str:
    """A short fingerprint of everything the standard recipe's reading depends on: its BF16 run's (the reference
    key), the reading's settings, the space's fixed recipe settings and its backend."""
    recipe = {name: knob.fixed for name, knob in space.search.recipe if knob.is_fixed}
    payload = {"reference": reference_key(space, clip_grad, device), "standard": STANDARD_VERSION,
               "settings": space.objectives.damage.model_dump(mode="json", exclude=_NOT_FIGURES),
               "recipe": {k: getattr(v, "value", v) for k, v in recipe.items()}, "backend": space.backend.value}
    blob = json.dumps(payload, sort_keys=True, default=str)
    return "standard-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


class StandardReadings:
    """One worker's standard readings, by clipping value: from the study's cache, or read once.

    Args:
        space: The study's space (none is read unless its reading has fixed states and asks for the standard).
        cache: The study's BF16 reference cache, where the readings are kept.
        device: The device the probes run on (part of the key, as for the references).
        say: Prints a line of the study's log.
        tag: Records study-level MLflow tags (the standard's value per clipping value, its description).
    """

    def __init__(self, space: Space, cache: ReferenceCache, device: torch.device, say: Callable[[str], None],
                 tag: Callable[[dict[str, str]], None]):
        reading = get_reading(space.objectives.reading)
        self.on = reading.fixed_states and reading.standard_reference(space.objectives)
        self._space, self._cache, self._device, self._say, self._tag = space, cache, device, say, tag
        self._left_out: set[float | None] = set()  # failed in this run, or no standard recipe runs here
        self._tagged: set[float | None] = set()

    def reading(self, clip_grad: float | None, read: Callable[[], ProbeResult]) -> dict[str, Any] | None:
        """The standard recipe's reading at ``clip_grad`` (``value``, ``se``, ``recipe``...), calling ``read`` (a
        request to the probe process) when the study has none yet; None when off, failed, or none runs here."""
        if not self.on or clip_grad in self._left_out:
            return None
        try:
            damage = self._cache.get(standard_key(self._space, clip_grad, self._device), read,
                                     field="objectives.damage.standard_reference").damage
        except (ProbeFailed, ProbeCrashed) as exc:
            self._left_out.add(clip_grad)
            self._say(f"the reading of {STANDARD_NAME} for clip_grad={clip_grad} failed ({first_line(exc)}): trials "
                      f"with this clip value show no multiple of it; the study's next run tries it again")
            return None
        if damage is None:
            self._left_out.add(clip_grad)
            self._say(f"no standard FP8 recipe runs on this backend and device: trials show no multiple of one")
            return None
        if clip_grad not in self._tagged:
            self._tagged.add(clip_grad)
            self._tag({f"instability_standard.clip_grad_{clip_grad}": number(damage["value"]),
                       "standard_recipe": str(damage.get("recipe", ""))})
        return damage

    def notice(self, clip_grad: float | None, trial: int) -> str:
        """Why the probe process reads one more policy now (said when the study has no standard reading yet)."""
        return (f"trial {trial}: reading {STANDARD_NAME} for clip_grad={clip_grad} at the same states and batches, "
                f"once per clip value (kept in references/): each trial's instability is also shown as a multiple of "
                f"it (objectives.damage.standard_reference: false skips it)")
