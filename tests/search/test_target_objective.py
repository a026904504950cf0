"""A study whose ``target:`` is a framework optimises what that framework's run saves (issue 52, item 1).

Before, such a study scored precsearch's own probe and optimizer, and the front only added what the target
would save as a note: an Accelerate study's max-memory pick said 42.4% on the front and 37.2% beside it (H100,
2026-12-06). If these tests fail, the front ranks trials on a figure the user's framework does not get.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import optuna
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.policy import Policy
from precsearch.runtime.target_memory import study_target_saving, target_saving
from precsearch.runtime.workspace import Workspace


def _run(tmp_path, monkeypatch, **overrides) -> tuple[optuna.Study, Workspace, str]:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    space = write_space(tmp_path, tiny_space_dict(**overrides))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", str(space), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 0
    ws = Workspace.load(tmp_path / "out")
    return optuna.load_study(study_name=ws.study_name, storage=ws.storage_url), ws, out.getvalue()


def _scored(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]


def test_an_accelerate_study_scores_accelerates_saving(tmp_path, monkeypatch, capsys):
    study, ws, printed = _run(tmp_path, monkeypatch, target={"name": "accelerate"})
    space = study.user_attrs["space"]
    trials = _scored(study)
    assert trials
    differs = 0
    for t in trials:
        score = t.user_attrs["score"]
        expected = study_target_saving(space, Policy.from_dict(t.user_attrs["policy"])).saved
        assert score["memory_framework"] == "accelerate"
        assert score["memory_saved"] == score["memory_saved_framework"] == expected
        assert t.values[0] == expected  # what Optuna optimised
        differs += not math.isclose(expected, score["memory_saved_target"], abs_tol=1e-4)
        assert f"trial {t.number}: memory saved {100 * expected:.2f}% (in accelerate, predicted)" in printed
    assert differs, "Accelerate's figure equals precsearch's for every trial: the test cannot tell them apart"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(ws.tracking_uri)
    for t in trials:  # MLflow's runs show the figure the study scored, and say whose it is
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.metrics["memory_saved"] == run.data.metrics["memory_saved_framework"] \
            == t.user_attrs["score"]["memory_saved"]
        assert run.data.tags["memory_source"] == "accelerate's run, predicted"
        # its memory breakdown is Accelerate's run too, the parts the front's "saved from" names
        import json

        saving = study_target_saving(space, Policy.from_dict(t.user_attrs["policy"]))
        path = client.download_artifacts(run.info.run_id, "memory/breakdown.json", str(tmp_path))
        data = json.loads(Path(path).read_text())
        assert data["target"]["trial"] == saving.trial_parts and data["target"]["baseline"] == saving.baseline_parts
        assert data["target_peak"]["trial"] == saving.peak_bytes
        assert data["target_peak"]["source"] == "accelerate's run, predicted with its rules"
        from precsearch.tracking.memory_report import saving_sources

        assert t.user_attrs["memory_sources"] == saving_sources(saving.trial_parts, saving.baseline_parts)
    assert main(["front", "--all", "--output-dir", str(ws.output_dir)]) == 0
    front = capsys.readouterr().out
    assert "mem saved: what accelerate's run of the trial saves, predicted" in front
    assert "[precsearch itself: memory saved " in front and "[target: memory saved" not in front


def test_a_study_without_a_target_scores_precsearchs_own_run(tmp_path, monkeypatch):
    study, _, _ = _run(tmp_path, monkeypatch)
    for t in _scored(study):
        score = t.user_attrs["score"]
        assert score["memory_framework"] == "" and math.isnan(score["memory_saved_framework"])
        assert score["memory_saved"] == score["memory_saved_target"]


def test_the_probe_basis_scores_the_framework_at_the_probes_depth():
    data = tiny_space_dict(**{"target": {"name": "accelerate"}, "objectives.memory_basis": "probe",
                              "model.n_layers": 4, "model.probe_layers": 2})
    space = parse_space(data).model_dump(mode="json")
    policy = Policy.from_dict({"rules": [{"name": "mlp", "modules": ["*.mlp.*"], "precision": "fp8_current"}]})
    at_probe = study_target_saving(space, policy)
    assert at_probe.n_layers == 2 and at_probe.saved == target_saving(space, "accelerate", policy, 2).saved
    assert study_target_saving({**space, "objectives": {**space["objectives"], "memory_basis": "target"}},
                               policy).n_layers == 4
    assert study_target_saving({**space, "target": {"name": "precsearch"}}, policy) is None


def test_a_megatron_study_on_a_cpu_keeps_the_probes_speed_up_and_says_why(tmp_path, monkeypatch):
    """Megatron's optimizer step is measured on an H100 only: on this CPU no speed-up is predicted, the probe's
    stands, and the trial's MLflow run says what was missing (tests/runtime/test_target_speed.py: where it is)."""
    study, ws, _ = _run(tmp_path, monkeypatch, target={"name": "megatron"},
                        **{"objectives.throughput": True, "search.warmup_steps": 0})
    trials = _scored(study)
    assert trials
    from mlflow.tracking import MlflowClient

    client = MlflowClient(ws.tracking_uri)
    for t in trials:
        score = t.user_attrs["score"]
        assert score["speedup"] == score["speedup_probe"] and math.isnan(score["speedup_framework"])
        assert "megatron's optimizer step for the trial" in score["speedup_note"]
        tags = client.get_run(t.user_attrs["mlflow_run_id"]).data.tags
        assert tags["speed_source"] == f"the probe ({score['speedup_note']})"
