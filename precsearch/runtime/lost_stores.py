"""When one of a study's two stores was deleted and the other kept: keep them from contradicting.

* ``mlflow.db`` gone, Optuna study kept: the study names MLflow runs the new store lacks.
  :func:`lost_runs` finds them once per worker; they are said once, then never touched (tagging
  them would fail on every update of the front). Their trials stay in the study and the front.
* ``optuna.db`` gone, MLflow kept: a new study of the same name starts at trial 0 beside the
  old runs. :func:`retire_earlier_runs` tags those ``pareto=false`` and ``precsearch.retired``
  so that the UI's front shows the new study's trials only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from precsearch.tracking import Tracker


def lost_runs(tracker: Tracker, run_ids: dict[int, str], say: Callable[[str], None]) -> set[str]:
    """The ids among ``run_ids`` (trial -> MLflow run, from the study) that the tracking store lacks."""
    lost = set(run_ids.values()) - tracker.trial_run_ids()
    if lost:
        say(f"the MLflow store has no runs of {len(lost)} earlier trials (deleted or replaced): they stay in "
            "the Optuna study and 'precsearch front'; new trials are logged here")
    return lost


def retire_earlier_runs(tracker: Tracker, study_name: str) -> None:
    """Retire the MLflow runs of an earlier study of this name; called when the Optuna study is created."""
    retired = tracker.retire_trials(f"an earlier study '{study_name}' whose Optuna storage is gone")
    if retired:
        print(f"precsearch: {retired} MLflow runs of an earlier study '{study_name}' (its Optuna storage is "
              "gone) are tagged precsearch.retired and pareto=false", file=sys.stderr)
