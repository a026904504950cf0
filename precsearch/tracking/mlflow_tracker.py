"""Logging a study to MLflow.

Layout a reviewer finds in the UI:

* one study run per study (tag ``precsearch.role=study``), holding the space
  file, the study's metrics (:mod:`precsearch.tracking.study_report`) and the
  Pareto front as ``front/front.csv``, ``front/front.json``,
  ``front/front.png`` and ``front/front.html``;
* one run per trial (``trial-<n>``), with the policy as flat params, the
  full policy as ``policy.yaml``, per-step ``train_loss``/``grad_norm``, the
  final metrics, and tags ``trial_state`` and ``pareto`` (``true``/``false``).

Trial runs are top-level runs that name their study run in the tag
``precsearch.study_run``, not nested MLflow children: the UI opens nested runs
collapsed under their parent and cannot be told otherwise from the tracking
side, so a filter such as ``tags.pareto = 'true'`` would show the collapsed
parent instead of the trials. The experiment carries the tags of
:mod:`precsearch.tracking.experiment_view` (model-training mode, shared views).

Re-running the same study re-opens its study run instead of making another.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from precsearch.tracking.experiment_view import KIND, KIND_TAG, experiment_tags
from precsearch.tracking.review_columns import review_metrics, trial_look

_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch


class _RetryingClient:
    """An ``MlflowClient`` whose calls are retried with backoff while the tracking server is unreachable."""

    def __init__(self, client: MlflowClient, budget_s: float):
        self._client, self._budget_s = client, budget_s

    def __getattr__(self, name: str):
        method = getattr(self._client, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            from precsearch.utils.retry import with_retry

            return with_retry(lambda: method(*args, **kwargs), f"MLflow {name}", budget_s=self._budget_s)

        return call


class Tracker:
    """One study's MLflow runs.

    Args:
        uri: The tracking URI (a local sqlite store, or an ``http://`` tracking server).
        experiment: The experiment name (created if missing).
        artifact_dir: Where a new experiment keeps artifacts when the store is local (a tracking
            server uses its own artifact store).
        study_name: The Optuna study, tagged on every run.
        parent_id: The study's parent run, when a worker joins a study another process opened; by
            default the parent run is found (or created) and marked RUNNING.
        retry_s: How long each call keeps retrying while the server is unreachable.
    """

    def __init__(self, uri: str, experiment: str, artifact_dir: Path, study_name: str,
                 parent_id: str | None = None, retry_s: float = 0.0):
        self.raw_client = MlflowClient(tracking_uri=uri)
        self.client = _RetryingClient(self.raw_client, retry_s) if retry_s > 0 else self.raw_client
        self.uri = uri
        self.study_name = study_name
        self.experiment_name = experiment
        self.retry_s = retry_s
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            local = not uri.startswith(("http://", "https://", "databricks"))
            location = Path(artifact_dir).resolve().as_uri() if local else None
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            self.experiment_id = found.experiment_id
        if found is None or found.tags.get(KIND_TAG) != KIND:
            self.client.set_experiment_tag(self.experiment_id, KIND_TAG, KIND)
        self.parent_id = parent_id or self._parent_run()

    def with_retries(self, retry_s: float) -> "Tracker":
        """From now on, retry each call for up to ``retry_s`` seconds while the store is unreachable."""
        self.retry_s = retry_s
        self.client = _RetryingClient(self.raw_client, retry_s) if retry_s > 0 else self.raw_client
        return self

    def _parent_run(self) -> str:
        query = f"tags.`precsearch.role` = 'study' AND tags.`precsearch.study` = '{self.study_name}'"
        runs = self.client.search_runs([self.experiment_id], query, max_results=1)
        if runs:
            self.client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id
        tags = {"precsearch.role": "study", "precsearch.study": self.study_name}
        return self.client.create_run(self.experiment_id, tags=tags, run_name=f"study-{self.study_name}").info.run_id

    def log_space(self, space_yaml: str, params: dict[str, Any]) -> None:
        """The space file and its main settings on the parent run (once); passwords in URLs are masked."""
        from precsearch.redact import redact_text

        self.client.log_text(self.parent_id, redact_text(space_yaml), "space.yaml")
        existing = self.client.get_run(self.parent_id).data.params
        fresh = [Param(k, redact_text(str(v))) for k, v in params.items() if k not in existing]
        if fresh:
            self.client.log_batch(self.parent_id, params=fresh)

    def start_trial(self, number: int, params: dict[str, Any], worker: str = "") -> str:
        """A child run for trial ``number``; returns its run id.

        Safe to retry: the run carries a one-off token, and a retry after a lost reply finds the run
        the first attempt made instead of making a second one.
        """
        token = uuid.uuid4().hex
        tags = {
            "precsearch.study_run": self.parent_id,
            "precsearch.role": "trial",
            "precsearch.study": self.study_name,
            "precsearch.worker": worker,
            "precsearch.token": token,
            "trial_number": str(number),
            "trial_state": "RUNNING",
        } | trial_look(number, on_front=False)

        def create() -> str:
            found = self.raw_client.search_runs([self.experiment_id], f"tags.`precsearch.token` = '{token}'",
                                                max_results=1)
            if found:
                return found[0].info.run_id
            return self.raw_client.create_run(self.experiment_id, tags=tags, run_name=f"trial-{number}").info.run_id

        if self.retry_s > 0:
            from precsearch.utils.retry import with_retry

            run_id = with_retry(create, "MLflow create_run", budget_s=self.retry_s)
        else:
            run_id = create()
        if params:
            self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
        return run_id

    def log_steps(self, run_id: str, series: dict[str, list[float]]) -> None:
        """Per-step metrics, e.g. ``{"train_loss": [...], "grad_norm": [...]}``."""
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, values in series.items() for step, v in enumerate(values)]
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i:i + _BATCH])

    def finish_trial(self, run_id: str, metrics: dict[str, float], tags: dict[str, str],
                     artifacts: dict[str, str]) -> None:
        """Final metrics (and their display copies, :mod:`~precsearch.tracking.review_columns`), tags and text
        artifacts; closes the run as FINISHED."""
        now = int(time.time() * 1000)
        metrics = metrics | review_metrics(metrics, tags.get("stability_unit", "relative"))
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        for name, text in artifacts.items():
            self.client.log_text(run_id, text, name)
        self.client.set_terminated(run_id, "FINISHED")

    def log_bytes(self, run_id: str, data: bytes, name: str) -> None:
        """A binary artifact (e.g. a PNG) at ``name`` (``dir/file.png``) on a run."""
        import tempfile

        folder, _, filename = name.rpartition("/")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / filename
            path.write_bytes(data)
            self.client.log_artifact(run_id, str(path), artifact_path=folder or None)

    def fail_trial(self, run_id: str, reason: str, status: str = "FAILED", retry: bool = True) -> None:
        """Close a trial's run as FAILED (or KILLED) with the reason (passwords masked) as a tag.

        ``retry=False`` makes one attempt (for a worker that is stopping now).
        """
        from precsearch.redact import redact_text

        client = self.client if retry else self.raw_client
        client.set_tag(run_id, "trial_state", "FAIL")
        client.set_tag(run_id, "fail_reason", redact_text(reason)[:5000])
        client.set_terminated(run_id, status)

    def close_orphans(self, is_dead: Callable[[str], bool]) -> int:
        """Mark KILLED the trial runs still RUNNING whose worker process is dead.

        Such runs are left by a kill between creating the run and recording it on the trial, or by a
        worker that closed its trial in Optuna but lost the MLflow server before closing the run.
        ``is_dead(worker_tag)`` must answer False for workers it cannot check (another host).
        """
        query = (f"tags.`precsearch.role` = 'trial' AND tags.`precsearch.study` = '{self.study_name}' "
                 "AND attributes.status = 'RUNNING'")
        orphans = [r.info.run_id for r in self.client.search_runs([self.experiment_id], query, max_results=1000)
                   if is_dead(r.data.tags.get("precsearch.worker", ""))]
        for run_id in orphans:
            self.fail_trial(run_id, "interrupted: its worker process is gone", "KILLED")
        return len(orphans)

    def trial_run_ids(self) -> set[str]:
        """The ids of every trial run of this study in the experiment."""
        query = f"tags.`precsearch.role` = 'trial' AND tags.`precsearch.study` = '{self.study_name}'"
        runs = self.client.search_runs([self.experiment_id], query, max_results=50_000)
        return {r.info.run_id for r in runs}

    def retire_trials(self, reason: str) -> int:
        """Tag every trial run of this study ``pareto=false`` and ``precsearch.retired`` (running ones KILLED).

        For runs left by an earlier Optuna study of the same name that is gone (its database deleted):
        they must not stay on the front beside the new study's trials.
        """
        query = f"tags.`precsearch.role` = 'trial' AND tags.`precsearch.study` = '{self.study_name}'"
        runs = self.client.search_runs([self.experiment_id], query, max_results=50_000)
        for run in runs:
            self.client.log_batch(run.info.run_id, tags=[RunTag("pareto", "false"),
                                                         RunTag("precsearch.retired", reason)])
            if run.info.status == "RUNNING":
                self.client.set_terminated(run.info.run_id, "KILLED")
        return len(runs)

    def set_pareto(self, run_ids: dict[int, str], front: set[int],
                   extra: dict[int, dict[str, str]] | None = None) -> None:
        """Tag every trial run ``pareto=true`` or ``false``, named and coloured as on or off the front
        (:func:`~precsearch.tracking.review_columns.trial_look`), with ``extra``'s tags for it (trial number ->
        tags: ``runs_as_is_in``); only changed tags are written."""
        for number, run_id in run_ids.items():
            have = self.client.get_run(run_id).data.tags
            want = trial_look(number, number in front) | (extra or {}).get(number, {})
            changed = [RunTag(k, v) for k, v in want.items() if have.get(k) != v]
            if changed:  # another run of the study may write the same new tags now
                _again_if_raced(lambda: self.client.log_batch(run_id, tags=changed))

    def set_view(self, param_names: list[str], unit: str = "relative", noise: bool = True,
                 standard: bool = False) -> None:
        """The experiment's shared views (:mod:`~precsearch.tracking.experiment_view`) for these params, with
        instability in the study's ``stability_unit`` (``noise``: whether the study has a BF16 seed noise floor,
        ``standard``: whether some trial has a multiple of the standard FP8 recipe's reading; each column is shown
        only then)."""
        have = self.client.get_experiment(self.experiment_id).tags
        for key, value in experiment_tags(param_names, unit, noise, standard).items():
            if have.get(key) != value:  # another run of the study may write the same new tag now
                _again_if_raced(lambda: self.client.set_experiment_tag(self.experiment_id, key, value))

    def log_study(self, metrics: dict[str, float]) -> None:
        """Study-level metrics on the study run (a new value at the next step each time)."""
        now = int(time.time() * 1000)
        step = int(metrics.get("trials_finished", 0))
        self.client.log_batch(self.parent_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def tag_study(self, tags: dict[str, str]) -> None:
        """Study-level tags on the study run (set again with the same value by every worker that reads them)."""
        self.client.log_batch(self.parent_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_front(self, files: list[Path]) -> None:
        """Replace the parent run's front artifacts."""
        for path in files:
            self.client.log_artifact(self.parent_id, str(path), artifact_path="front")

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_id, status)

    def close_stopped(self, say: Callable[[str], None]) -> None:
        """Close the study's run as KILLED for a worker that is stopping now: one attempt, never the retry budget
        (a second Ctrl-C that landed inside one of this process's store writes can leave SQLite locked until the
        process exits; waiting it out turned a Ctrl-C into a minute and a store error). If it fails, the next
        ``precsearch run`` of the study finds its run and goes on with it."""
        try:
            self.raw_client.set_terminated(self.parent_id, "KILLED")
        except Exception as exc:  # noqa: BLE001 - best effort, see above
            say(f"could not close the study's MLflow run now ({type(exc).__name__}); it stays RUNNING until the "
                "study runs again")


def _again_if_raced(write: Callable[[], Any]) -> None:
    """``write()`` a tag that another process of the study may be writing at this moment, again if it lost.

    MLflow's SQL store reads a tag's row, then inserts it when there was none: two runs writing a new tag at
    once both insert, and the second fails on the unique key (CI, 2026-12-05: two runs started at once on one
    directory, writing the experiment's views). The row exists then, and writing again updates it.
    """
    try:
        write()
    except MlflowException as exc:
        if not _lost_insert_race(exc):
            raise
        write()


def _lost_insert_race(exc: Exception) -> bool:
    """An insert that failed on a unique key: SQLite's and PostgreSQL's wording, as MLflow passes them on."""
    text = str(exc)
    return any(s in text for s in ("UNIQUE constraint failed", "IntegrityError", "UniqueViolation",
                                   "duplicate key value"))
