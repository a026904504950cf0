"""What a backend can run, and how it refuses what it cannot: the part of the backend contract that is data.

:class:`BackendSupport` answers "does this precision, this memory knob, run on that device?"
without a model, so it imports no torch. :class:`~precsearch.backends.base.Backend` extends it
with converting models. A backend whose answers need no query of the machine (the emulated one:
everything runs everywhere) has them here too (:class:`EmulatedSupport`), so that the checks of a
CPU space (``precsearch validate``) never import torch; the registry hands it out as
:attr:`~precsearch.backends.registry.BackendEntry.support`.

``device`` below is a ``torch.device``, or a device's name (``"cpu"``) where no query of it is needed;
it is only named in messages by the answers defined here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Union

from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import LayerRecipe, Precision

if TYPE_CHECKING:
    import torch

#: A ``torch.device``, or the name of one.
Device = Union["torch.device", str]


class UnsupportedRecipe(Exception):
    """A backend cannot run a requested precision on this device."""


class BackendUnavailable(Exception):
    """A backend's library (Transformer Engine, torchao) or hardware is missing."""


class BackendSupport:
    """Which precisions and memory knobs a backend runs on a device; subclasses give :meth:`supported_precisions`."""

    #: The name used in space files (``backend: emulated``).
    name: str = ""

    def supported_precisions(self, device: Device) -> dict[Precision, str | None]:
        """For each precision: None if it runs on ``device``, else the reason it cannot."""
        raise NotImplementedError

    def check_supported(self, recipes: Mapping[str, LayerRecipe], device: Device) -> None:
        """Raise :class:`UnsupportedRecipe` if any layer's recipe cannot run here."""
        table = self.supported_precisions(device)
        for layer, recipe in recipes.items():
            reason = table.get(recipe.precision, "unknown precision")
            if reason is not None:
                valid = sorted(p.value for p, r in table.items() if r is None)
                raise UnsupportedRecipe(
                    f"backend '{self.name}' cannot run '{recipe.precision.value}' "
                    f"(layer {layer}) on {device}: {reason}. Valid here: {', '.join(valid)}"
                )

    def memory_knob_problem(self, knobs: MemoryKnobs, device: Device) -> str | None:
        """None if this backend applies ``knobs`` on ``device``; else why it cannot.

        The default backend trains with ``torch.optim.AdamW`` and full-precision
        weights, so it accepts only the default knobs.
        """
        if knobs.is_default:
            return None
        named = ", ".join(knobs.changed())
        return (f"{named}: backend '{self.name}' trains with torch AdamW and keeps weights in the parameter dtype; "
                "master weights, moment dtypes (FP8 moments need TE FusedAdam), FP8 weights and FP8 attention "
                "need backend 'te' on a GPU")


class EmulatedSupport(BackendSupport):
    """The emulated backend's answers: every precision on any device (float32 arithmetic), default knobs only."""

    name = "emulated"

    def supported_precisions(self, device: Device) -> dict[Precision, str | None]:
        """Every precision runs anywhere (it is all float32 arithmetic)."""
        return {p: None for p in Precision}
