"""A study that searches speed shows each trial's speed-up with its interval, and stores the errors (issue 53).

If these fail, the terminal, the stored score and MLflow disagree on a trial's speed, or speed is shown as exact
where the study's own steps say how far it can be trusted.
"""

from __future__ import annotations

import contextlib
import io
import math
import re

import optuna
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.runtime.workspace import Workspace


def test_a_throughput_study_prints_and_stores_each_trials_speed_with_its_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    space = write_space(tmp_path, tiny_space_dict(**{"objectives.throughput": True}))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", str(space), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 0
    ws = Workspace.load(tmp_path / "out")
    study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    trials = [t for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert trials
    from mlflow.tracking import MlflowClient

    client = MlflowClient(ws.tracking_uri)
    for t in trials:
        score = t.user_attrs["score"]
        assert math.isfinite(score["tokens_per_s_se"]) and math.isfinite(score["speedup_se"])  # the probe's steps
        line = re.search(rf"trial {t.number}: memory saved .*?, speed-up (\S+)x ± (\S+),", out.getvalue())
        assert line, out.getvalue()
        assert float(line.group(1)) == round(score["speedup"], 2)
        assert float(line.group(2)) == round(2 * score["speedup_se"], 2)
        metrics = client.get_run(t.user_attrs["mlflow_run_id"]).data.metrics
        assert metrics["speedup_se"] == score["speedup_se"] and metrics["tokens_per_s_se"] == score["tokens_per_s_se"]
