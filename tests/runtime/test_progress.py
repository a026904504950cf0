"""The terminal's study status line, the BF16 reference notice and the next commands after a run."""

from __future__ import annotations

from pathlib import Path

from precsearch.cli import main, next_commands
from precsearch.runtime.progress import duration, reference_notice, status_line
from precsearch.search.summary import study_metrics


def test_status_line_counts_and_eta():
    line = status_line("qs", 12, 4, 3, 2, 120.0, 4, running=4)
    assert line == "study qs: trial 4 running; 4 of 12 trials finished, 3 feasible, front 2 | elapsed 2m00s, ETA 4m00s"
    # trials finished by an earlier run do not speed up the estimate
    assert "ETA 8m00s" in status_line("qs", 12, 8, 3, 2, 120.0, 1)
    assert status_line("qs", 12, 0, 0, 0, 5.0, 0).endswith("ETA after the first trial")
    assert status_line("qs", 12, 12, 5, 3, 3700.0, 12).endswith("elapsed 1h01m, done")
    assert duration(59.4) == "59s" and duration(61) == "1m01s"


def test_reference_notice_says_why():
    text = reference_notice(1.0, 3, 60, stress=False)
    assert "clip_grad=1.0" in text and "3 seed(s) x 60 steps" in text and "noise floor" in text
    assert "stress" in reference_notice(None, 1, 60, stress=True)


def test_next_commands_name_front_ui_and_export():
    text = next_commands(Path("/tmp/some dir"))
    assert "precsearch front --all --output-dir '/tmp/some dir'" in text
    assert "precsearch ui --output-dir '/tmp/some dir'" in text
    # the policy goes under the study's directory, not into the current one (untracked in a clone)
    assert "precsearch export --output-dir '/tmp/some dir' --pick max-memory -o '/tmp/some dir/policy.yaml'" in text


def _row(trial, memory, instability, feasible=True, pareto=False):
    return {"trial": trial, "memory_saved": memory, "instability": instability, "tokens_per_s": 10.0,
            "feasible": feasible, "pareto": pareto}


def test_study_metrics():
    rows = [_row(0, 0.05, 0.5, pareto=True), _row(1, 0.10, 0.75, pareto=True), _row(2, 0.2, 2.0, feasible=False)]
    m = study_metrics(rows, finished=4, objectives=["memory_saved", "instability"])
    assert m["trials_finished"] == 4 and m["trials_scored"] == 3 and m["trials_feasible"] == 2
    assert m["front_size"] == 2 and m["best_memory_saved"] == 0.10
    # reference (0 saved, instability 1.0): 0.05 x 0.5 + (0.10 - 0.05) x 0.25
    assert abs(m["hypervolume"] - (0.025 + 0.0125)) < 1e-12
    assert "best_memory_saved" not in study_metrics([rows[2]], 1, ["memory_saved", "instability"])


def test_ui_optuna_without_the_dashboard_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    import importlib.util

    from precsearch.runtime.workspace import Workspace

    Workspace(tmp_path, "s", f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db", "s").save()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna_dashboard"
                        else real(name, *a))
    assert main(["ui", "--optuna", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optuna-dashboard" in err[0] and "--optuna" in err[0]


def test_ui_optuna_serves_the_study_storage(tmp_path, capsys, monkeypatch):
    import sys
    import types

    from precsearch.runtime.workspace import Workspace

    ws = Workspace(tmp_path, "s", f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db", "s")
    ws.save()
    served = {}
    fake = types.ModuleType("optuna_dashboard")
    fake.__spec__ = types.SimpleNamespace(name="optuna_dashboard")
    fake.run_server = lambda storage, host, port: served.update(storage=storage, host=host, port=port)
    monkeypatch.setitem(sys.modules, "optuna_dashboard", fake)
    assert main(["ui", "--optuna", "--output-dir", str(tmp_path), "--port", "5099"]) == 0
    assert served == {"storage": ws.storage_url, "host": "127.0.0.1", "port": 5099}
