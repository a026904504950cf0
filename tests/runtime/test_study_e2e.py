"""A whole study on a tiny space, through the CLI: Optuna storage, MLflow runs, front, export, resume."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _cluster import trials_in_state
from _spaces import tiny_space_dict, write_space
from precsearch import load_policy
from precsearch.cli import main
from precsearch.search.front import trial_rows
from precsearch.runtime.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory) -> Workspace:
    tmp = tmp_path_factory.mktemp("study")
    space = write_space(tmp, tiny_space_dict())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(space), "--output-dir", str(tmp / "out"), "--no-progress"]) == 0
    (tmp / "run.log").write_text(printed.getvalue())  # what the terminal showed, for the tests below
    return Workspace.load(tmp / "out")


def _study(ws: Workspace) -> optuna.Study:
    return optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)


def _runs(ws: Workspace):
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name(ws.experiment)
    return client, client.search_runs([exp.experiment_id], max_results=1000)


def test_mlflow_has_one_study_run_and_one_run_per_finished_trial(finished_study):
    study = _study(finished_study)
    complete = [t for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert len(complete) == 4  # a duplicate (the same policy proposed again) is neither counted nor logged
    client, runs = _runs(finished_study)
    parents = [r for r in runs if r.data.tags.get("precsearch.role") == "study"]
    children = [r for r in runs if r.data.tags.get("precsearch.study_run") == parents[0].info.run_id]
    # top-level runs: the UI opens nested runs collapsed under their parent, hiding the trials (issue 15)
    assert not any("mlflow.parentRunId" in r.data.tags for r in runs)
    assert len(parents) == 1
    assert len(children) == len(complete)
    child = children[0]
    assert {"memory_saved", "instability", "tokens_per_s", "peak_memory_mib"} <= set(child.data.metrics)
    history = client.get_metric_history(child.info.run_id, "train_loss")
    assert len(history) == 12  # one point per probe step
    assert any(k.startswith("precision.") for k in child.data.params)
    assert "policy.yaml" in {a.path for a in client.list_artifacts(child.info.run_id)}
    # the early-warning signals against the paired BF16 reference (issue 14), with their plot
    assert {"risk_score", "signal_kurtosis", "signal_ref_kurtosis", "signal_alignment"} <= set(child.data.metrics)
    assert 0 <= child.data.metrics["risk_score"] <= 1
    assert {"signals.json", "signals.png"} <= {a.path.split("/")[-1] for a in
                                              client.list_artifacts(child.info.run_id, "signals")}


def test_pareto_tags_match_the_front(finished_study):
    study = _study(finished_study)
    rows = trial_rows(study, study.user_attrs["objectives"])
    front = {r["trial"] for r in rows if r["pareto"]}
    assert front, "a study with feasible trials has a non-empty front"
    _, runs = _runs(finished_study)
    tagged = {int(r.data.tags["trial_number"]) for r in runs if r.data.tags.get("pareto") == "true"}
    assert tagged == front
    # the chart legend and the table mark the front by name, and no two trials share a colour
    trials = [r for r in runs if r.data.tags.get("precsearch.role") == "trial"]
    assert {r.info.run_name for r in trials} == {f"trial-{r.data.tags['trial_number']}"
                                                 + (" (front)" if int(r.data.tags["trial_number"]) in front else "")
                                                 for r in trials}
    assert len({r.data.tags["mlflow.runColor"] for r in trials}) == len(trials)


def test_pareto_filter_lists_the_front_trials(finished_study):
    client, runs = _runs(finished_study)
    experiment = client.get_experiment_by_name(finished_study.experiment)
    study = _study(finished_study)
    front = {r["trial"] for r in trial_rows(study, study.user_attrs["objectives"]) if r["pareto"]}
    found = client.search_runs([experiment.experiment_id], "tags.pareto = 'true'")
    assert {int(r.data.tags["trial_number"]) for r in found} == front
    assert all(r.data.tags["precsearch.role"] == "trial" for r in found)


def test_experiment_opens_in_model_training_mode_on_the_study_view(finished_study):
    from precsearch.tracking.experiment_view import FRONT_FILTER, FRONT_KEY, VIEW_KEY, VIEW_PREFIX

    client = MlflowClient(finished_study.tracking_uri)
    tags = client.get_experiment_by_name(finished_study.experiment).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"  # not GenAI mode
    view = json.loads(tags[VIEW_PREFIX + VIEW_KEY])
    params = set(_study(finished_study).trials[0].params)
    # the flags first (MLflow's Assistant panel covers the right), then the objectives in percent
    assert view["selectedColumns"][:6] == ["tags.`feasible`", "tags.`pareto`", "metrics.`memory_saved_pct`",
                                           "metrics.`instability_in_unit`", "metrics.`tokens_per_s`",
                                           "metrics.`gap_in_noise`"]
    assert {f"params.`{p}`" for p in params} <= set(view["selectedColumns"])
    # feasible trials first, by memory saved
    assert view["orderByKey"] == "metrics.`feasible_first_memory_saved`" and view["orderByAsc"] is False
    assert json.loads(tags[VIEW_PREFIX + FRONT_KEY])["searchFilter"] == FRONT_FILTER
    axes = [(c["xaxis"]["key"], c["yaxis"]["key"]) for c in view["compareRunCharts"]]
    assert ("memory_saved_pct", "instability_in_unit") in axes  # the chart view opens on the trade-off
    _, runs = _runs(finished_study)
    for run in (r for r in runs if r.data.tags.get("precsearch.role") == "trial"):
        m = run.data.metrics
        assert m["memory_saved_pct"] == round(100 * m["memory_saved"], 2)
        assert m["feasible_first_memory_saved"] == m["memory_saved_pct"] + (1000 if m["feasible"] else 0)


def test_study_run_carries_study_metrics(finished_study):
    from precsearch.search.summary import study_metrics

    client, runs = _runs(finished_study)
    parent = next(r for r in runs if r.data.tags.get("precsearch.role") == "study")
    study = _study(finished_study)
    names = study.user_attrs["objectives"]
    rows = trial_rows(study, names)
    metrics = parent.data.metrics
    assert metrics["trials_finished"] == 4
    assert metrics["trials_feasible"] == sum(r["feasible"] for r in rows)
    assert metrics["front_size"] == sum(r["pareto"] for r in rows)
    assert metrics["hypervolume"] == pytest.approx(study_metrics(rows, 4, names)["hypervolume"])
    assert metrics["best_memory_saved"] == pytest.approx(max(r["memory_saved"] for r in rows if r["feasible"]))
    # one value per update: the history shows the study's progress
    assert len(client.get_metric_history(parent.info.run_id, "trials_finished")) >= 4


def test_trial_run_page_artifacts(finished_study):
    client, runs = _runs(finished_study)
    trial = next(r for r in runs if r.data.tags.get("precsearch.role") == "trial")
    files = {a.path for a in client.list_artifacts(trial.info.run_id)}
    assert {"policy.md", "memory.md", "loss_curves.png", "policy.yaml"} <= files
    table = Path(client.download_artifacts(trial.info.run_id, "policy.md")).read_text()
    assert table.startswith("| block | linear_qkv | linear_proj | linear_fc1 | linear_fc2 |")


def test_terminal_shows_status_lines_reference_reason_and_next_commands(finished_study):
    log = (finished_study.output_dir.parent / "run.log").read_text()
    assert "running the BF16 references for clip_grad=1.0" in log
    status = [line for line in log.splitlines() if line.startswith("study tiny: ")]
    assert len(status) == 4 and status[-1].startswith("study tiny: 4 of 4 trials finished")
    assert status[0].startswith("study tiny: 1 of 4 trials finished") and "ETA " in status[0]
    assert "precsearch ui --output-dir" in log and "precsearch export --output-dir" in log


def test_front_all_has_feasible_and_pareto_columns(finished_study, capsys):
    assert main(["front", "--all", "--output-dir", str(finished_study.output_dir)]) == 0
    unit, *lines = capsys.readouterr().out.splitlines()  # the unit line, then the table
    assert unit.startswith("instability in "), unit
    assert lines[0].split()[-3:] == ["feasible", "pareto", "policy"]
    study = _study(finished_study)
    rows = {r["trial"]: r for r in trial_rows(study, study.user_attrs["objectives"])}
    end = lines[0].index("pareto") + len("pareto")  # the columns are right-aligned under their header
    start = lines[0].index("feasible") - 2
    for line in lines[2:]:
        row = rows[int(line.split()[0])]
        assert line[start:end].split() == ["yes" if row["feasible"] else "no", "yes" if row["pareto"] else "no"]


def test_front_artifacts_on_parent(finished_study):
    client, runs = _runs(finished_study)
    parent = next(r for r in runs if r.data.tags.get("precsearch.role") == "study")
    files = {a.path for a in client.list_artifacts(parent.info.run_id, "front")}
    assert files == {"front/front.csv", "front/front.json", "front/front.png", "front/front.html"}
    local = client.download_artifacts(parent.info.run_id, "front/front.json")
    study = _study(finished_study)
    rows = trial_rows(study, study.user_attrs["objectives"])
    assert sorted(r["trial"] for r in json.loads(Path(local).read_text())) == sorted(
        r["trial"] for r in rows if r["pareto"])


def test_front_command_prints_the_same_front(finished_study, capsys):
    assert main(["front", "--output-dir", str(finished_study.output_dir)]) == 0
    out = capsys.readouterr().out
    study = _study(finished_study)
    rows = trial_rows(study, study.user_attrs["objectives"])
    printed = {int(line.split()[0]) for line in out.splitlines()[3:]}  # below the unit line, header and rule
    assert printed == {r["trial"] for r in rows if r["pareto"]}


def test_export_writes_a_loadable_policy(finished_study, tmp_path, capsys):
    study = _study(finished_study)
    trial = next(t for t in study.trials if t.state is TrialState.COMPLETE)
    out = tmp_path / "policy.yaml"
    assert main(["export", "--output-dir", str(finished_study.output_dir), "--trial", str(trial.number),
                 "-o", str(out)]) == 0
    policy = load_policy(out)
    assert policy.to_dict() == trial.user_attrs["policy"]


def test_rerun_of_a_finished_study_runs_nothing_new(finished_study, capsys):
    space = finished_study.output_dir.parent / "space.yaml"
    before = len(_study(finished_study).trials)
    assert main(["run", str(space), "--output-dir", str(finished_study.output_dir), "--no-progress"]) == 0
    assert len(_study(finished_study).trials) == before
    assert "4 of 4 trials already finished" in capsys.readouterr().out


def _complete(ws_dir: Path, name: str) -> list:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{ws_dir / 'optuna.db'}")
    return [t for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]


def test_killed_run_resumes_without_repeating_finished_trials(tmp_path):
    """SIGKILL mid-study, re-run the same command: finished trials are kept, the study completes."""
    data = tiny_space_dict(**{"study.n_trials": 5, "probe.steps": 30})
    space = write_space(tmp_path, data)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "precsearch", "run", str(space), "--output-dir", str(out), "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while trials_in_state(out) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = {t.number: t.datetime_complete for t in _complete(out, "tiny")}
    assert 2 <= len(first) < 5, "the kill must land mid-study"

    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    after = _complete(out, "tiny")
    assert len(after) == 5
    assert {t.number: t.datetime_complete for t in after if t.number in first} == first  # not re-run
    ws = Workspace.load(out)
    _, runs = _runs(ws)
    finished = [r for r in runs if r.data.tags.get("precsearch.role") == "trial" and r.info.status == "FINISHED"]
    assert len(finished) == 5


def test_ui_serves_the_study_on_loopback(finished_study):
    """`precsearch ui` starts MLflow's server on 127.0.0.1 and it lists the study's experiment."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "precsearch", "ui", "--output-dir", str(finished_study.output_dir),
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name={finished_study.experiment}"
    body, deadline = None, time.time() + 90
    try:
        while body is None and time.time() < deadline and proc.poll() is None:
            try:
                body = json.loads(urllib.request.urlopen(url, timeout=2).read())
            except OSError:
                time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert body is not None, "the MLflow UI did not answer within 90 s"
    assert body["experiment"]["name"] == finished_study.experiment


def _start_and_interrupt(tmp_path, presses: int):
    space = write_space(tmp_path, tiny_space_dict(**{"study.n_trials": 6, "probe.steps": 40,
                                                     "objectives.reference_seeds": 1}))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "precsearch", "run", str(space), "--output-dir", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (trials_in_state(out) >= 1 and trials_in_state(out, "RUNNING") == 1) and time.time() < deadline \
            and proc.poll() is None:
        time.sleep(0.2)  # a trial finished and the next one is in flight
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
    out_text, err = proc.communicate(timeout=300)
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}")
    return proc.returncode, out_text, err, study


def test_ctrl_c_during_the_references_stops_within_seconds_and_the_resume_runs_the_trial(tmp_path):
    """One SIGINT while the BF16 reference runs: out in seconds (not after the references and a trial),
    nothing left RUNNING, the trial queued again, no half reference cached; the same command resumes it."""
    space = write_space(tmp_path, tiny_space_dict(**{"study.n_trials": 1, "probe.steps": 400,
                                                     "objectives.reference_seeds": 1}))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "precsearch", "run", str(space), "--output-dir", str(out), "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    # the reference's lock exists from when it starts: a fixed sleep after the trial opened raced the
    # reference on an idle machine, where the probes take both cores and 200 steps end within 2 s
    while not list((out / "references").glob("*.lock")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(0.5)  # inside the 400-step reference probe
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out_text, err = proc.communicate(timeout=120)
    latency = time.monotonic() - sent
    assert proc.returncode == 130, err
    assert latency < 10, f"Ctrl-C took {latency:.1f} s"
    assert "Re-run the same command to resume" in err and "Traceback" not in err
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}")
    assert not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.COMPLETE)]
    assert [t.user_attrs.get("interrupted") for t in study.trials if t.state is TrialState.FAIL] == [True]
    assert len([t for t in study.trials if t.state is TrialState.WAITING]) == 1
    assert not list((out / "references").glob("*.json"))  # the interrupted reference is not cached
    # the interrupted trial never finishes under its number: the user is told where its params went
    assert "trial 0 interrupted: marked failed, its params queued to run again" in out_text + err

    resumed = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=600)
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}")
    assert len([t for t in study.trials if t.state is TrialState.COMPLETE]) == 1
    assert "trial 1 runs the params of trial 0 again (queued when that one was interrupted)" in resumed.stdout


def test_second_ctrl_c_stops_at_once_and_requeues_the_trial(tmp_path):
    """Two SIGINTs half a second apart: out in seconds, the trial in flight closed as interrupted and its
    params queued again. A press that lands while the interpreter is already exiting ends it by SIGINT."""
    code, out, err, study = _start_and_interrupt(tmp_path, presses=2)
    assert code in (130, -signal.SIGINT), err
    assert "Re-run the same command to resume" in err and "Traceback" not in err
    assert not [t for t in study.trials if t.state is TrialState.RUNNING]
    interrupted = [t for t in study.trials if t.user_attrs.get("interrupted")]
    waiting = [t for t in study.trials if t.state is TrialState.WAITING]
    assert len(interrupted) == 1 and [w.system_attrs['fixed_params'] for w in waiting] == [interrupted[0].params]


def test_a_ctrl_c_while_a_trial_is_asked_starts_no_mlflow_run_and_no_probe(tmp_path, monkeypatch, capsys):
    """Ctrl-C landing between a trial's ask and its probe: the worker used to start its MLflow run (0.5 s on a
    busy machine) and its probe, then kill it. The trial is closed and queued again before either starts."""
    from precsearch.runtime import _optimize

    real = _optimize.await_twin

    def ctrl_c_here(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the study's handler notes the stop request
        return real(*args, **kwargs)

    monkeypatch.setattr(_optimize, "await_twin", ctrl_c_here)
    space = write_space(tmp_path, tiny_space_dict(**{"study.n_trials": 2, "objectives.reference_seeds": 1}))
    assert main(["run", str(space), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 130
    ws = Workspace.load(tmp_path / "out")
    study = _study(ws)
    closed = [t for t in study.trials if t.state is TrialState.FAIL]
    assert [t.user_attrs.get("interrupted") for t in closed] == [True]
    assert "mlflow_run_id" not in closed[0].user_attrs  # no MLflow run was started for it
    waiting = [t for t in study.trials if t.state is TrialState.WAITING]  # the seeded batch's proposals, and it
    assert [t.user_attrs.get("requeued_from") for t in waiting if t.system_attrs["fixed_params"] == closed[0].params
            ] == [closed[0].number]
    assert "trial 0 interrupted: marked failed" in capsys.readouterr().out
    _, runs = _runs(ws)
    assert [r.data.tags.get("precsearch.role") for r in runs] == ["study"]  # no trial's run
