"""Fidelity rungs in a whole study: promotion, continuation, the front, MLflow, export, resume, workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _cluster import finish, precsearch, wait_for
from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.search.front import trial_rows
from precsearch.search.promotion import FIDELITY, PROMOTED_FROM
from precsearch.runtime.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


def _space(tmp_path: Path, rungs: list[int], promote: int, **overrides) -> Path:
    return write_space(tmp_path, tiny_space_dict(**{"study.fidelity": {"rungs": rungs, "promote": promote},
                                                    **overrides}))


def _storage(out: Path) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(f"sqlite:///{out / 'optuna.db'}", engine_kwargs={"connect_args": {"timeout": 60}})


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name="tiny", storage=_storage(out))


def _by_number(study: optuna.Study) -> dict:
    return {t.number: t for t in study.trials}


def _promoted(study: optuna.Study, state=TrialState.COMPLETE) -> list:
    return [t for t in study.trials if PROMOTED_FROM in t.user_attrs and t.state is state]


@pytest.fixture(scope="module")
def rung_study(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rungs")
    space = _space(tmp, [12, 24], 2, **{"objectives.reference_seeds": 2})
    assert main(["run", str(space), "--output-dir", str(tmp / "out"), "--no-progress"]) == 0
    return tmp / "out"


def test_the_best_first_rung_trials_continue_their_run_at_the_next_rung(rung_study):
    """Two promoted trials, each continuing its source from step 12 with the source's 12 losses as its start.

    A promoted trial restarted from step 0 would have start_step 0; one that did not continue the same
    run would not repeat its source's losses.
    """
    study = _study(rung_study)
    trials = _by_number(study)
    first = [t for t in study.trials if t.state is TrialState.COMPLETE and t.user_attrs[FIDELITY] == 12
             and "duplicate_of" not in t.user_attrs]  # a policy proposed again is not a trial of the rung
    assert len(first) == 4 and all(PROMOTED_FROM not in t.user_attrs for t in first)
    promoted = _promoted(study)
    assert len(promoted) == 2
    for t in promoted:
        source = trials[t.user_attrs[PROMOTED_FROM]]
        result, before = t.user_attrs["probe_result"], source.user_attrs["probe_result"]
        assert t.user_attrs[FIDELITY] == 24 and t.params == source.params
        assert result["start_step"] == 12 and len(result["losses"]) == 24
        assert result["losses"][:12] == before["losses"]


def test_no_trial_checkpoint_is_left_once_the_rungs_are_done(rung_study):
    """Every first-rung trial saved one; the promoted ones were continued, the others were not chosen:
    none is needed once the last rung finished, so none stays on disk."""
    assert (rung_study / "checkpoints").is_dir()
    assert sorted((rung_study / "checkpoints").glob("trial-*.pt")) == []


def test_the_references_continue_across_rungs_too(rung_study):
    """Each seed's 24-step BF16 reference is its 12-step reference continued (same first 12 losses)."""
    refs = [json.loads(p.read_text()) for p in (rung_study / "references").glob("*.json")]
    short = [r for r in refs if len(r["losses"]) == 12]
    long = [r for r in refs if len(r["losses"]) == 24]
    assert len(short) == len(long) == 2  # two seeds, one gradient-clipping value
    for r in long:
        assert r["start_step"] == 12
        assert any(r["losses"][:12] == s["losses"] for s in short)


def test_the_front_takes_each_policy_at_its_highest_rung(rung_study):
    study = _study(rung_study)
    rows = trial_rows(study, study.user_attrs["objectives"])
    promoted_sources = {t.user_attrs[PROMOTED_FROM] for t in _promoted(study)}
    assert not promoted_sources & {r["trial"] for r in rows}  # superseded by their longer rung
    assert sorted(r["fidelity_steps"] for r in rows if r["promoted_from"] is not None) == [24, 24]


def test_mlflow_records_the_rung_of_every_trial(rung_study):
    ws = Workspace.load(rung_study)
    client = MlflowClient(ws.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(ws.experiment).experiment_id], max_results=1000)
    trial_runs = [r for r in runs if r.data.tags.get("precsearch.role") == "trial"]
    steps = Counter(int(r.data.metrics["fidelity_steps"]) for r in trial_runs)
    assert steps == {12: 4, 24: 2}
    assert all(r.data.tags["fidelity_steps"] == str(int(r.data.metrics["fidelity_steps"])) for r in trial_runs)
    promoted = [r for r in trial_runs if r.data.tags["promoted_from"] != "-"]
    assert len(promoted) == 2 and all(r.data.metrics["start_step"] == 12 for r in promoted)
    history = client.get_metric_history(promoted[0].info.run_id, "train_loss")
    assert len(history) == 24  # the whole run, from step 0


def test_export_warns_when_the_verdict_is_only_from_the_shortest_rung(rung_study, capsys):
    study = _study(rung_study)
    promoted = _promoted(study)
    sources = {t.user_attrs[PROMOTED_FROM] for t in promoted}
    plain = next(t.number for t in study.trials if t.state is TrialState.COMPLETE
                 and t.user_attrs[FIDELITY] == 12 and t.number not in sources
                 and t.params not in [p.params for p in promoted])
    out = str(rung_study)
    assert main(["export", "--output-dir", out, "--trial", str(plain)]) == 0
    assert "only from the shortest rung (12 steps)" in capsys.readouterr().err
    assert main(["export", "--output-dir", out, "--trial", str(sorted(sources)[0])]) == 0
    assert "is superseded by trial" in capsys.readouterr().err
    assert main(["export", "--output-dir", out, "--trial", str(promoted[0].number)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_rerun_of_a_finished_rung_study_runs_nothing_new(rung_study):
    before = len(_study(rung_study).trials)
    space = rung_study.parent / "space.yaml"
    assert main(["run", str(space), "--output-dir", str(rung_study), "--no-progress"]) == 0
    assert len(_study(rung_study).trials) == before


def test_a_policy_that_diverges_at_a_longer_rung_is_recorded_there_and_not_promoted_further(tmp_path,
                                                                                           monkeypatch):
    """Trial 3 (the one promotion to 24 steps, after the three 12-step trials) is made to produce NaN: it is
    diverged at 24 steps, nothing runs at 36, and the policy leaves the front although its 12-step trial was
    feasible."""
    monkeypatch.setenv("PRECSEARCH_FAULTS", "3:nan")
    space = _space(tmp_path, [12, 24, 36], 1, **{"study.n_trials": 3, "objectives.reference_seeds": 1})
    assert main(["run", str(space), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 0
    study = _study(tmp_path / "out")
    trials = _by_number(study)
    diverged = trials[3]
    assert diverged.user_attrs[FIDELITY] == 24 and diverged.state is TrialState.COMPLETE
    assert diverged.user_attrs["score"]["diverged"] and "non-finite" in diverged.user_attrs["reason"]
    assert diverged.user_attrs["probe_result"]["diverged_step"] == 12  # the rung's first step, continued
    assert not [t for t in study.trials if t.user_attrs.get(FIDELITY) == 36]
    source = trials[diverged.user_attrs[PROMOTED_FROM]]
    assert source.user_attrs["score"]["feasible"]
    rows = trial_rows(study, study.user_attrs["objectives"])
    row = next(r for r in rows if r["params"] == source.params)
    assert row["trial"] == 3 and not row["pareto"]


def test_a_run_killed_mid_rung_resumes_the_rung_from_the_saved_state(tmp_path):
    """SIGKILL while a promoted trial runs, re-run: it is queued again with its rung and source, and the
    retry continues the source's checkpoint (start_step 12, the source's 12 losses first), not step 0."""
    # a 600-step rung: at 150 steps an idle machine, whose probes take both cores, finished the promoted
    # trial (its reference leg and its own) inside the 3 s the kill waits
    space = _space(tmp_path, [12, 600], 1, **{"study.n_trials": 3, "objectives.reference_seeds": 1})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "precsearch", "run", str(space), "--output-dir", str(out), "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log = tmp_path / "first_run.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)

    def promoted_running() -> bool:
        # CI timed out here once (600 s) with nothing to say why: a run that ended first says so, with its log
        if proc.poll() is not None:
            states = [(t.number, t.state.name, t.user_attrs.get(PROMOTED_FROM)) for t in _study(out).trials]
            raise AssertionError(f"the run exited ({proc.returncode}) before a promoted trial was seen running; "
                                 f"trials {states}")
        try:
            return any(t.state is TrialState.RUNNING and PROMOTED_FROM in t.user_attrs
                       for t in _study(out).trials)
        except Exception:  # noqa: BLE001 - the study may not exist yet
            return False

    try:
        wait_for(promoted_running, 600, "a promoted trial to start")
    except AssertionError as exc:
        if proc.poll() is None:
            proc.kill()
        raise AssertionError(f"{exc}\n--- the run's output ---\n{log.read_text()[-4000:]}") from None
    time.sleep(3)  # into the rung's steps
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not _promoted(_study(out)), "the kill must land before the promoted trial finished"

    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    study = _study(out)
    interrupted = [t for t in study.trials if t.user_attrs.get("interrupted")]
    done = _promoted(study)
    assert len(interrupted) == 1 and len(done) == 1
    assert (done[0].user_attrs[PROMOTED_FROM], done[0].user_attrs[FIDELITY]) == (
        interrupted[0].user_attrs[PROMOTED_FROM], 600)
    source = _by_number(study)[done[0].user_attrs[PROMOTED_FROM]]
    result = done[0].user_attrs["probe_result"]
    assert result["start_step"] == 12 and len(result["losses"]) == 600
    assert result["losses"][:12] == source.user_attrs["probe_result"]["losses"]


def test_two_workers_run_each_promotion_once(tmp_path):
    """`run --workers 2`: every policy's first rung and each promotion run exactly once; one MLflow run each."""
    space = _space(tmp_path, [12, 24], 2, **{"study.n_trials": 4, "objectives.reference_seeds": 1})
    out = tmp_path / "out"
    proc = precsearch("run", str(space), "--workers", "2", "--no-progress", "--output-dir", str(out),
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = finish(proc, 900)
    assert proc.returncode == 0, log[-3000:]
    study = _study(out)
    complete = [t for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert Counter(t.user_attrs[FIDELITY] for t in complete) == {12: 4, 24: 2}
    promotions = Counter(t.user_attrs[PROMOTED_FROM] for t in _promoted(study))
    assert len(promotions) == 2 and set(promotions.values()) == {1}
    assert not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert len({t.user_attrs["worker"]["pid"] for t in complete}) == 2, "both workers ran trials"
    ws = Workspace.load(out)
    client = MlflowClient(ws.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(ws.experiment).experiment_id], max_results=1000)
    per_trial = Counter(int(r.data.tags["trial_number"]) for r in runs
                        if r.data.tags.get("precsearch.role") == "trial")
    assert per_trial == {t.number: 1 for t in complete}
