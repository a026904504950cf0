"""The space's ``target:``: what will train with the study's policies, so the search offers only what it runs.

::

    target:
      name: megatron          # precsearch, megatron, torchtitan or accelerate
      version: core_v0.16.0   # optional: the version precsearch's export was checked against

``precsearch`` is precsearch's own Python API and optimizer (``policy.yaml``): it runs every policy the tool
can search. For a framework, ``precsearch validate`` refuses every searched choice the framework cannot run
as the probe ran it (a precision it has no recipe for, an optimizer-state knob, the FP8 warm-up, FP8
attention...), listing them all. What a framework runs is read from the files its export writes
(:func:`precsearch.export.registry.cannot_express`); the check of a space against it is
:mod:`precsearch.runtime.target_space` (config knows no export). Without ``target:`` every choice is offered,
and the front says which targets run each trial as it is.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from precsearch.config.section import Section

#: The names a space's ``target: name`` takes: the export registry's targets (``tests/test_registries.py``).
TargetName = Literal["precsearch", "megatron", "torchtitan", "accelerate"]


class TargetSection(Section):
    """What trains with the study's policies, and its version."""

    name: TargetName = Field(description="precsearch (its Python API and optimizer), megatron, torchtitan or "
                                         "accelerate")
    version: str | None = Field(None, min_length=1, description="the target's version (default: the one "
                                "precsearch's export was checked against)")


__all__ = ["TargetName", "TargetSection"]
