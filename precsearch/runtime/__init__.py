"""The runtime that runs a study's trials: the study facade and loop, workers and their processes,
liveness, stores and their retries, the output directory and the BF16 references.

The optimisation it drives (sampling, scoring, the Pareto front, promotion) is in
:mod:`precsearch.search`; this package only runs it. Entry point: :func:`run_study`
(:mod:`.study`). This machine's checks of a space are :func:`precsearch.runtime.preflight.preflight`
(not re-exported: the name is its module's). Public names are re-exported here and imported on first use.
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["export", "gpu_checks_left", "open_storage", "parse_gpus", "probe_process", "run_study", "run_worker",
           "Workspace"]

_WHERE = {
    "probe_process": "executor",
    "parse_gpus": "launcher",
    "gpu_checks_left": "preflight",
    "open_storage": "stores",
    "run_study": "study",
    "export": "study_export",
    "run_worker": "worker",
    "Workspace": "workspace",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
