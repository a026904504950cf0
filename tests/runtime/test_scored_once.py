"""A trial is scored once, where it is told; its MLflow run is written from that stored score.

Before, the recorder scored each trial's probe a second time to write its run: two scorings of one result that
only agreed while nothing between them changed (a reading's state, a stored reference).
"""

from __future__ import annotations

import contextlib
import io

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.space import Space
from precsearch.runtime.workspace import Workspace
from precsearch.search import scored_trial
from precsearch.search.scored_trial import ScoredTrial


def test_each_trial_is_scored_once_and_its_run_shows_that_score(tmp_path, monkeypatch):
    calls = []
    real = scored_trial.score

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(scored_trial, "score", counted)
    space = write_space(tmp_path, tiny_space_dict())
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(space), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 0
    ws = Workspace.load(tmp_path / "out")
    study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    scored = [t for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert scored and len(calls) == len(scored), "one scoring per trial run, none in the recorder"
    objectives = Space.model_validate(study.user_attrs["space"]).objectives
    client = MlflowClient(ws.tracking_uri)
    for t in scored:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        record = ScoredTrial.from_stored(t.user_attrs["score"], objectives)
        assert run.data.tags["verdict"] == record.verdict
        assert run.data.metrics["memory_saved"] == record.score.memory_saved
        assert list(t.values) == list(record.values)
