"""Logging a study to MLflow.

Layout a reviewer finds in the UI:

* one parent run per study (tag ``precsearch.role=study``), holding the space
  file, and the Pareto front as ``front/front.csv``, ``front/front.json``,
  ``front/front.png`` and ``front/front.html``;
* one child run per trial (``trial-<n>``), with the policy as flat params, the
  full policy as ``policy.yaml``, per-step ``train_loss``/``grad_norm``, the
  final metrics, and tags ``trial_state`` and ``pareto`` (``true``/``false``).

Re-running the same study re-opens its parent run instead of making another.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch


class Tracker:
    """One study's MLflow runs."""

    def __init__(self, uri: str, experiment: str, artifact_dir: Path, study_name: str):
        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        self.study_name = study_name
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            location = Path(artifact_dir).resolve().as_uri()
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            self.experiment_id = found.experiment_id
        self.parent_id = self._parent_run()

    def _parent_run(self) -> str:
        query = f"tags.`precsearch.role` = 'study' AND tags.`precsearch.study` = '{self.study_name}'"
        runs = self.client.search_runs([self.experiment_id], query, max_results=1)
        if runs:
            self.client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id
        tags = {"precsearch.role": "study", "precsearch.study": self.study_name}
        return self.client.create_run(self.experiment_id, tags=tags, run_name=f"study-{self.study_name}").info.run_id

    def log_space(self, space_yaml: str, params: dict[str, Any]) -> None:
        """The space file and its main settings on the parent run (once)."""
        self.client.log_text(self.parent_id, space_yaml, "space.yaml")
        existing = self.client.get_run(self.parent_id).data.params
        fresh = [Param(k, str(v)) for k, v in params.items() if k not in existing]
        if fresh:
            self.client.log_batch(self.parent_id, params=fresh)

    def start_trial(self, number: int, params: dict[str, Any]) -> str:
        """A child run for trial ``number``; returns its run id."""
        tags = {
            "mlflow.parentRunId": self.parent_id,
            "precsearch.role": "trial",
            "precsearch.study": self.study_name,
            "trial_number": str(number),
            "trial_state": "RUNNING",
            "pareto": "false",
        }
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=f"trial-{number}")
        if params:
            self.client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()])
        return run.info.run_id

    def log_steps(self, run_id: str, series: dict[str, list[float]]) -> None:
        """Per-step metrics, e.g. ``{"train_loss": [...], "grad_norm": [...]}``."""
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, values in series.items() for step, v in enumerate(values)]
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i:i + _BATCH])

    def finish_trial(self, run_id: str, metrics: dict[str, float], tags: dict[str, str],
                     artifacts: dict[str, str]) -> None:
        """Final metrics, tags and text artifacts; closes the run as FINISHED."""
        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        for name, text in artifacts.items():
            self.client.log_text(run_id, text, name)
        self.client.set_terminated(run_id, "FINISHED")

    def fail_trial(self, run_id: str, reason: str, status: str = "FAILED") -> None:
        """Close a trial's run as FAILED (or KILLED) with the reason as a tag."""
        self.client.set_tag(run_id, "trial_state", "FAIL")
        self.client.set_tag(run_id, "fail_reason", reason[:5000])
        self.client.set_terminated(run_id, status)

    def close_orphans(self, known: set[str]) -> int:
        """Mark KILLED the trial runs still RUNNING that no trial points to (a kill between run and trial).

        Only safe while one process runs the study (it would close another worker's fresh run).
        """
        query = (f"tags.`precsearch.role` = 'trial' AND tags.`precsearch.study` = '{self.study_name}' "
                 "AND attributes.status = 'RUNNING'")
        orphans = [r.info.run_id for r in self.client.search_runs([self.experiment_id], query, max_results=1000)
                   if r.info.run_id not in known]
        for run_id in orphans:
            self.fail_trial(run_id, "interrupted before its trial was recorded", "KILLED")
        return len(orphans)

    def set_pareto(self, run_ids: dict[int, str], front: set[int]) -> None:
        """Tag every trial run ``pareto=true`` or ``false``; only changed tags are written."""
        for number, run_id in run_ids.items():
            want = "true" if number in front else "false"
            if self.client.get_run(run_id).data.tags.get("pareto") != want:
                self.client.set_tag(run_id, "pareto", want)

    def log_front(self, files: list[Path]) -> None:
        """Replace the parent run's front artifacts."""
        for path in files:
            self.client.log_artifact(self.parent_id, str(path), artifact_path="front")

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_id, status)
