"""The probe's memory: the peak model of one process (:mod:`.peak`) and of one rank of several
(:mod:`.rank_peak`), blocks under ``torch.compile`` (:mod:`.compiled`), a framework's own step
(:mod:`.frameworks`), memory by step phase (:mod:`.phases`), and calibration against measured depths
(:mod:`.calibration`).

Public names are re-exported here and imported on first use.
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["Calibration", "DepthMeasurement", "fit_calibration", "PhaseMemory", "predict_peak", "predict_rank_peak",
           "predict_target"]

_WHERE = {
    "Calibration": "calibration",
    "DepthMeasurement": "calibration",
    "fit_calibration": "calibration",
    "predict_target": "calibration",
    "predict_peak": "peak",
    "PhaseMemory": "phases",
    "predict_rank_peak": "rank_peak",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
