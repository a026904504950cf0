"""What a run does with the output directory and stores it is given (issue 16, classes 4, 6, 7, 10).

Each refusal must come before anything is written: exit status 2, one line naming the flag or field,
no traceback, and an existing study's directory left as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.runtime.identity import setting_changes
from precsearch.config.space import Space

QUICK = {"study.n_trials": 1, "probe.steps": 6, "objectives.reference_seeds": 1}


def _run(capsys, space: Path, *extra: str) -> tuple[int, str]:
    code = main(["run", str(space), "--no-progress", *extra])
    return code, capsys.readouterr().err


def _one_line_error(err: str, names: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("precsearch: error:")]
    assert len(lines) == 1 and names in lines[0], err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished one-trial study in ``out``; tests must leave it as it is."""
    tmp = tmp_path_factory.mktemp("finished")
    space = write_space(tmp, tiny_space_dict(**QUICK))
    assert main(["run", str(space), "--output-dir", str(tmp / "out"), "--no-progress"]) == 0
    return tmp / "out"


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in [out / "precsearch.json", *sorted((out / "front").iterdir())]}


def _n_trials(out: Path) -> int:
    return len(optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}").trials)


@pytest.mark.parametrize("change, field", [
    ({"study.name": "other"}, "--output-dir"),                       # another study
    ({"probe.steps": 8}, "probe.steps"),                             # the probe
    ({"model.dim": 32, "model.n_heads": 2}, "model."),               # the probe's shape
    ({"data.max_tokens": 100000}, "data.max_tokens"),                # the data
    ({"objectives.stability_limit": 0.05}, "objectives.stability_limit"),
    ({"search.warmup_steps": {"choices": [0, 2]}}, "search.warmup_steps"),  # the searched choices
])
def test_a_changed_space_or_another_study_is_refused_and_the_directory_kept(finished, tmp_path, capsys, change,
                                                                           field):
    before, trials = _snapshot(finished), _n_trials(finished)
    space = write_space(tmp_path, tiny_space_dict(**QUICK | change))
    code, err = _run(capsys, space, "--output-dir", str(finished))
    assert code == 2
    _one_line_error(err, field)
    assert _snapshot(finished) == before and _n_trials(finished) == trials


def test_settings_that_only_steer_the_run_may_change(finished, tmp_path, capsys):
    space = write_space(tmp_path, tiny_space_dict(**QUICK | {"study.sampler": "tpe", "study.heartbeat_s": 5}))
    code, err = _run(capsys, space, "--output-dir", str(finished))
    assert code == 0, err
    assert _n_trials(finished) >= 1


def test_setting_changes_name_each_compared_setting_with_old_and_new_values():
    old = Space.model_validate(tiny_space_dict()).model_dump(mode="json")
    new = Space.model_validate(tiny_space_dict(**{"probe.steps": 30, "backend": "emulated",
                                                   "study.n_trials": 99}))
    assert setting_changes(old, new) == ["probe.steps: 12 -> 30"]


def test_a_changed_group_is_named_down_to_the_field_that_differs():
    """Both sides of a changed ``search.groups`` were cut to the same first 57 characters, so the user could
    not see what changed; each group's field is compared on its own, and a group on one side is absent."""
    groups = tiny_space_dict()["search"]["groups"]
    old = Space.model_validate(tiny_space_dict()).model_dump(mode="json")
    changed = [dict(g) for g in groups]
    changed[-1] = changed[-1] | {"precision": {"choices": ["bf16", "fp8_current"]}}
    name = changed[-1]["name"]
    changes = setting_changes(old, Space.model_validate(tiny_space_dict(**{"search.groups": changed})))
    assert len(changes) == 1 and changes[0].startswith(f"search.groups[{name}].precision.choices: "), changes
    before, after = changes[0].split(": ", 1)[1].split(" -> ")
    assert "fp8_current" in after and "fp8_current" not in before and "fp8_block" in before
    fewer = Space.model_validate(tiny_space_dict(**{"search.groups": groups[:-1]}))
    assert all(c.endswith("-> (absent)") and c.startswith(f"search.groups[{name}].")
               for c in setting_changes(old, fewer)), setting_changes(old, fewer)


def test_a_study_file_without_its_manifest_still_refuses_another_study(finished, tmp_path, capsys):
    out = tmp_path / "copy"
    out.mkdir()
    (out / "optuna.db").write_bytes((finished / "optuna.db").read_bytes())
    space = write_space(tmp_path, tiny_space_dict(**QUICK | {"study.name": "other"}))
    code, err = _run(capsys, space, "--output-dir", str(out))
    assert code == 2
    _one_line_error(err, "holds study 'tiny'")
    assert not (out / "precsearch.json").exists()


@pytest.mark.parametrize("make, name", [
    (lambda tmp: (tmp / "f").write_text("x") and tmp / "f", "a file"),
    (lambda tmp: (tmp / "f").write_text("x") and tmp / "f" / "sub", "under a file"),
    (lambda tmp: Path("/proc/precsearch-no-such-dir"), "a place the OS refuses"),
    (lambda tmp: tmp / ("n" * 300), "a name too long"),
])
def test_an_unusable_output_dir_is_one_line_naming_the_flag(tmp_path, capsys, make, name):
    space = write_space(tmp_path, tiny_space_dict(**QUICK))
    code, err = _run(capsys, space, "--output-dir", str(make(tmp_path)))
    assert code == 2, name
    _one_line_error(err, "--output-dir")


@pytest.mark.parametrize("study_name", ["../escape", "a/b", "..", "/tmp/abs", "n" * 300])
def test_a_study_name_that_is_not_one_folder_is_refused_naming_study_name(tmp_path, capsys, monkeypatch,
                                                                          study_name):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    space = write_space(tmp_path, tiny_space_dict(**QUICK | {"study.name": study_name}))
    code, err = _run(capsys, space)
    assert code == 2
    _one_line_error(err, "study.name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml", "work"]  # nothing written beside
    assert not [p for p in work.rglob("*") if p.is_file()]


@pytest.mark.parametrize("override, env, field", [
    ({"tracking.uri": "sqlite://"}, {}, "tracking.uri"),
    ({"tracking.uri": "sqlite:///:memory:"}, {}, "tracking.uri"),
    ({}, {"MLFLOW_TRACKING_URI": "sqlite:///:memory:"}, "$MLFLOW_TRACKING_URI"),
    ({"study.storage": "sqlite://"}, {}, "study.storage"),
    ({"study.storage": "sqlite:///file:x?mode=memory&uri=true"}, {}, "study.storage"),
])
def test_a_store_that_keeps_nothing_is_refused_up_front(tmp_path, capsys, monkeypatch, override, env, field):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    space = write_space(tmp_path, tiny_space_dict(**QUICK | override))
    code, err = _run(capsys, space, "--output-dir", str(tmp_path / "out"))
    assert code == 2
    _one_line_error(err, field)
    assert not (tmp_path / "out").exists()


def test_a_worker_refuses_an_in_memory_storage(capsys):
    assert main(["worker", "--study", "s", "--storage", "sqlite://", "--tracking-uri", "http://x"]) == 2
    _one_line_error(capsys.readouterr().err, "--storage")


def test_a_finished_study_resumes_from_a_moved_directory(finished, tmp_path, capsys):
    """The manifest's absolute paths follow the directory: the run uses the moved stores, not the old."""
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(finished, moved)
    space = write_space(tmp_path, tiny_space_dict(**QUICK))
    code, err = _run(capsys, space, "--output-dir", str(moved))
    assert code == 0, err
    manifest = json.loads((moved / "precsearch.json").read_text())
    assert manifest["output_dir"] == str(moved.resolve())
    assert str(finished) not in manifest["storage_url"] + manifest["tracking_uri"]
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{moved / 'optuna.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE]
    assert os.environ.get("MLFLOW_TRACKING_URI") is None


def test_the_same_directory_with_another_tracking_store_is_refused(finished, tmp_path, capsys, monkeypatch):
    """Trials would be split over two MLflow stores; the front of one would miss the others."""
    before = _snapshot(finished)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    space = write_space(tmp_path, tiny_space_dict(**QUICK))
    code, err = _run(capsys, space, "--output-dir", str(finished))
    assert code == 2
    _one_line_error(err, "tracking.uri")
    assert _snapshot(finished) == before and not (tmp_path / "elsewhere.db").exists()


def test_a_corrupt_manifest_is_refused_naming_the_file_and_left_for_the_user(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precsearch.json").write_text("{not json")
    space = write_space(tmp_path, tiny_space_dict(**QUICK))
    code, err = _run(capsys, space, "--output-dir", str(out))
    assert code == 2
    _one_line_error(err, "precsearch.json")
    assert (out / "precsearch.json").read_text() == "{not json"


def test_a_space_refused_on_this_machine_leaves_no_probe_process(tmp_path, capsys, monkeypatch):
    """``precsearch run`` starts the probe process before the space's checks on this machine (to overlap their
    imports): a refusal there (a data file that is not there) must end that process too, and say one line."""
    import multiprocessing as mp

    from precsearch.runtime import executor

    started = []
    real = executor.probe_process

    def counted(space):
        started.append(real(space))
        return started[-1]

    monkeypatch.setattr(executor, "probe_process", counted)
    data = {"source": "tokens", "path": str(tmp_path / "missing.bin"), "dtype": "uint16"}
    space = write_space(tmp_path, tiny_space_dict(**QUICK, data=data))
    code, err = _run(capsys, space, "--output-dir", str(tmp_path / "out"))
    assert code == 2
    _one_line_error(err, "data.path")
    assert len(started) == 1  # the refusal came after the probe process started
    assert not [p for p in mp.active_children() if p.name == "precsearch-probe"]


def _study_under_runs(root: Path, name: str):
    """A study as ``precsearch run`` leaves it under ``root/precsearch-runs/<name>`` (no trial yet)."""
    from precsearch.runtime.workspace import Workspace

    out = (root / "precsearch-runs" / name).resolve()
    out.mkdir(parents=True)
    ws = Workspace(out, name, f"sqlite:///{out}/optuna.db", f"sqlite:///{out}/mlflow.db", name)
    ws.save()
    study = optuna.create_study(study_name=name, storage=ws.storage_url, directions=["maximize", "minimize"])
    study.set_user_attr("objectives", ["memory_saved", "instability"])
    return ws


def _fake_dashboard(monkeypatch) -> dict:
    """optuna-dashboard replaced by a recorder of what it was asked to serve (``ui --optuna``)."""
    import sys
    import types

    served = {}
    fake = types.ModuleType("optuna_dashboard")
    fake.__spec__ = types.SimpleNamespace(name="optuna_dashboard")
    fake.run_server = lambda storage, host, port: served.update(storage=storage)
    monkeypatch.setitem(sys.modules, "optuna_dashboard", fake)
    return served


def test_front_export_and_ui_find_the_one_study_under_precsearch_runs(tmp_path, capsys, monkeypatch):
    """Without --output-dir they said 'no study here' beside the one study under precsearch-runs/."""
    ws = _study_under_runs(tmp_path, "alpha")
    monkeypatch.chdir(tmp_path)
    assert main(["front"]) == 0
    out, err = capsys.readouterr()
    assert "no finished feasible trial yet" in out and "precsearch-runs/alpha" in err, err
    assert main(["export", "--trial", "0"]) == 2  # the study is read: it has no trial 0 yet
    err = capsys.readouterr().err
    assert "alpha" in err and "no study here" not in err, err
    served = _fake_dashboard(monkeypatch)
    assert main(["ui", "--optuna"]) == 0
    assert served == {"storage": ws.storage_url}


@pytest.mark.parametrize("argv", [["front"], ["export", "--trial", "0"], ["ui", "--optuna"]],
                         ids=["front", "export", "ui"])
def test_several_studies_under_precsearch_runs_are_named_and_none_is_guessed(tmp_path, capsys, monkeypatch, argv):
    for name in ("alpha", "beta"):
        _study_under_runs(tmp_path, name)
    monkeypatch.chdir(tmp_path)
    served = _fake_dashboard(monkeypatch)
    assert main(argv) == 2
    err = capsys.readouterr().err
    _one_line_error(err, "--output-dir")
    assert "precsearch-runs/alpha" in err and "precsearch-runs/beta" in err, err
    assert not served


def test_no_study_here_nor_under_precsearch_runs_asks_for_output_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["front"]) == 2
    err = capsys.readouterr().err
    _one_line_error(err, "--output-dir")
    assert "no study here" in err and "precsearch-runs/" in err, err
