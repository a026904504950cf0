"""The probe's model: the Llama 3 modules (:mod:`.llama3`), loading Hugging Face weights (:mod:`.hf_weights`),
starting from a checkpoint (:mod:`.checkpoint_init`), and keeping a built model between probes (:mod:`.reuse`).

Public names are re-exported here and imported on first use (they need torch; importing this package does not).
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["build_model", "BuildKey", "Built", "init_from_checkpoint", "Llama3", "ModelCache", "named_plan",
           "rms_norm"]

_WHERE = {
    "init_from_checkpoint": "checkpoint_init",
    "build_model": "llama3", "Llama3": "llama3", "rms_norm": "llama3",
    "BuildKey": "reuse", "Built": "reuse", "ModelCache": "reuse", "named_plan": "reuse",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
