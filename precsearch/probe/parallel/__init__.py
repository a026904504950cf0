"""Probes over several processes: the FSDP2 launcher (:mod:`.distributed`), the per-rank side, tensor parallelism.

Public names are re-exported here and imported on first use.
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["check_gpus", "run_distributed_probe"]

_WHERE = {
    "check_gpus": "distributed", "run_distributed_probe": "distributed",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
