"""A sensitivity-guided study end to end: the pass, its logged table, queued candidates first, predictions per trial."""

from __future__ import annotations

import contextlib
import io
import json

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.search.candidates import sweep
from precsearch.search.guided import table_of
from precsearch.runtime.workspace import Workspace

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def guided_study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("guided")
    data = tiny_space_dict(**{"search.warmup_steps": 0, "study.n_trials": 4, "study.sampler": "tpe",
                              "search.units": [{"blocks": [1], "precision": {"choices": ["bf16", "fp8_current"]}},
                                               {"modules": ["output_layer"],
                                                "precision": {"choices": ["bf16", "fp8_current"]}}],
                              "search.sensitivity": {"budgets": 3, "eval_batches": 1},
                              "objectives.reference_seeds": 1})
    data["search"].pop("groups")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(write_space(tmp, data)), "--output-dir", str(tmp / "out"), "--no-progress"]) == 0
    ws = Workspace.load(tmp / "out")
    return ws, optuna.load_study(study_name=ws.study_name, storage=ws.storage_url), printed.getvalue()


def test_candidates_are_the_first_trials_and_the_sampler_continues(guided_study):
    _, study, printed = guided_study
    assert "sensitivity pass (forward" in printed and "queued" in printed
    trials = sorted(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    queued = [t for t in trials if "candidate" in t.user_attrs]
    assert queued and [t.number for t in queued] == list(range(len(queued)))  # probed before any sampled trial
    assert len(trials) > len(queued) or len(queued) == 4  # the sampler took over when the queue ran out
    table = table_of(study)
    assert {r.param for r in table.rows} == {"precision.L1.linear_qkv", "precision.L1.linear_proj",
                                             "precision.L1.linear_fc1", "precision.L1.linear_fc2",
                                             "precision.output_layer"}
    # the queued trials ran exactly the integer program's picks, in the sweep's order
    candidates = sweep(table, 3, "memory")
    assert len(queued) == len(candidates)
    for trial, cand in zip(queued, candidates):
        assert {k: trial.params[k] for k in cand.params} == cand.params
        assert trial.user_attrs["predicted_memory_saved"] == pytest.approx(cand.predicted_memory_saved)
    assert queued[0].user_attrs["predicted_memory_saved"] > 0


def test_table_heatmap_and_predictions_are_in_mlflow(guided_study):
    ws, study, _ = guided_study
    client = MlflowClient(ws.tracking_uri)
    parent = study.user_attrs["mlflow_parent_run_id"]
    names = {a.path for a in client.list_artifacts(parent, "sensitivity")}
    assert names == {"sensitivity/table.json", "sensitivity/table.csv", "sensitivity/heatmap.png"}
    local = client.download_artifacts(parent, "sensitivity/table.json")
    assert len(json.load(open(local))["rows"]) == 10  # 5 units x 2 precisions
    runs = [t.user_attrs["mlflow_run_id"] for t in study.get_trials(states=(TrialState.COMPLETE,))
            if "mlflow_run_id" in t.user_attrs]
    assert runs  # else the loop below would check nothing
    for run_id in runs:
        metrics = client.get_run(run_id).data.metrics
        assert {"predicted_instability", "predicted_memory_saved", "instability", "memory_saved"} <= set(metrics)
