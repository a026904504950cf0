"""What a probe measures besides its loss: diagnostics (:mod:`.diagnostics`), events (:mod:`.events`),
signals (:mod:`.signals`, explained in ``signals.md``, recorded by
:mod:`.signal_recorder`), risk (:mod:`.risk`), per-unit sensitivity (:mod:`.sensitivity`), timing.

Public names are re-exported here and imported on first use.
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["count_events", "DiagnosticsConfig", "FirstBad", "LayerWatch", "Risk", "risk_score", "seed_spread",
           "SignalRecorder", "Signals", "StepMonitor", "train_bf16", "unit_scores"]

_WHERE = {
    "DiagnosticsConfig": "diagnostics", "FirstBad": "diagnostics", "LayerWatch": "diagnostics",
    "count_events": "events", "StepMonitor": "events",
    "Risk": "risk", "risk_score": "risk", "seed_spread": "risk",
    "train_bf16": "sensitivity", "unit_scores": "sensitivity",
    "SignalRecorder": "signal_recorder",
    "Signals": "signals",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
