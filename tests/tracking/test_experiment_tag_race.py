"""Two runs of one study write the experiment's shared views at once: the one that loses MLflow's insert race
writes again instead of failing (CI, 2026-12-05: ``test_two_runs_started_at_once_on_a_fresh_directory``)."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from precsearch.tracking import Tracker
from precsearch.tracking.experiment_view import experiment_tags

PARAMS = ["attention", "mlp"]
# what MLflow's SQL store raises when its read found no row and another process inserted one before its insert
RACE = ("(sqlite3.IntegrityError) UNIQUE constraint failed: experiment_tags.key, experiment_tags.experiment_id\n"
        "[SQL: INSERT INTO experiment_tags (\"key\", value, experiment_id) VALUES (?, ?, ?)]")


class _OtherRunWritesFirst:
    """The client of a run that reads no tag, then finds the other run's insert ahead of its own, once."""

    def __init__(self, client, other: MlflowClient, error: str):
        self._client, self._other, self._error, self.lost = client, other, error, 0

    def __getattr__(self, name):
        return getattr(self._client, name)

    def set_experiment_tag(self, experiment_id, key, value):
        if not self.lost:
            self.lost += 1
            self._other.set_experiment_tag(experiment_id, key, value)  # the other run's insert lands first
            raise MlflowException(self._error)
        return self._client.set_experiment_tag(experiment_id, key, value)


def _tracker(tmp_path) -> tuple[Tracker, str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return Tracker(uri, "exp", tmp_path / "art", "s"), uri


def test_the_run_that_loses_the_insert_race_writes_its_view_again(tmp_path):
    tracker, uri = _tracker(tmp_path)
    racing = _OtherRunWritesFirst(tracker.client, MlflowClient(uri), RACE)
    tracker.client = racing
    tracker.set_view(PARAMS)
    assert racing.lost == 1
    tags = MlflowClient(uri).get_experiment(tracker.experiment_id).tags
    assert all(tags[k] == v for k, v in experiment_tags(PARAMS).items())


def test_any_other_mlflow_error_is_not_taken_for_the_race(tmp_path):
    tracker, uri = _tracker(tmp_path)
    tracker.client = _OtherRunWritesFirst(tracker.client, MlflowClient(uri), "RESOURCE_DOES_NOT_EXIST: no experiment")
    with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST"):
        tracker.set_view(PARAMS)


class _OtherRunTagsFirst(_OtherRunWritesFirst):
    """The same race on a trial run's front tags (both runs update the front at the end)."""

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        if not self.lost:
            self.lost += 1
            self._other.log_batch(run_id, tags=list(tags))
            raise MlflowException(RACE.replace("experiment_tags", "tags"))
        return self._client.log_batch(run_id, metrics=metrics, params=params, tags=tags)


def test_the_run_that_loses_the_race_on_a_trials_front_tags_writes_them_again(tmp_path):
    tracker, uri = _tracker(tmp_path)
    run_id = tracker.start_trial(0, {"attention": "fp8_current"})
    racing = _OtherRunTagsFirst(tracker.client, MlflowClient(uri), RACE)
    tracker.client = racing
    tracker.set_pareto({0: run_id}, front={0})
    assert racing.lost == 1
    assert MlflowClient(uri).get_run(run_id).data.tags["pareto"] == "true"
