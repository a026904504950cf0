"""Turning a chosen policy into files training code uses: the formats (:mod:`.registry`: Megatron-LM,
torchtitan, Accelerate, ``policy.yaml``), writing them (:mod:`.policy_export`), and the picks that choose
a trial from a front's rows (:mod:`.pick`).

Which trial, read from the study, is chosen in :mod:`precsearch.runtime.study_export`: export knows no
study. Public names are re-exported here and imported on first use.
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["block_ranges", "choose_trial", "FORMATS", "PICKS", "render", "write_export"]

_WHERE = {
    "block_ranges": "format_output",
    "choose_trial": "pick", "PICKS": "pick",
    "write_export": "policy_export",
    "FORMATS": "registry", "render": "registry",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
