"""MLflow tracking: one parent run per study, one nested run per trial (:mod:`.trial_record`), the front as
artifacts (:mod:`.front_report`), reports and plots, the UI server (:mod:`.server`, :mod:`.local_server`).

Tracking records; it does not drive the search. :class:`Tracker` is imported with the package (as before);
the other public names on first use.
"""

from __future__ import annotations

from precsearch.tracking.mlflow_tracker import Tracker
from precsearch.utils.lazy import lazy_exports

__all__ = ["artifact_url", "breakdown", "experiment_url", "LocalTrackingServer", "log_trial",
           "mlflow_server_command", "QUIET_ENV", "relocate_artifacts", "saving_sources", "SearchReading",
           "sensitivity_artifacts", "Tracker", "write_front"]

_WHERE = {
    "artifact_url": "experiment_view", "experiment_url": "experiment_view",
    "write_front": "front_report",
    "LocalTrackingServer": "local_server",
    "breakdown": "memory_report", "saving_sources": "memory_report",
    "relocate_artifacts": "relocate",
    "sensitivity_artifacts": "sensitivity_report",
    "mlflow_server_command": "server", "QUIET_ENV": "server",
    "log_trial": "trial_record", "SearchReading": "trial_record",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
