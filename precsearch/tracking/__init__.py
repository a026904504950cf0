"""MLflow tracking: one parent run per study, one nested run per trial, the front as artifacts."""

from precsearch.tracking.mlflow_tracker import Tracker

__all__ = ["Tracker"]
