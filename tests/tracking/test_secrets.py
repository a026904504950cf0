"""Database and tracking passwords never reach MLflow or the terminal.

A space file may name ``study.storage: postgresql://user:password@host/db`` or a tracking URI with
credentials. The study logs the space file to MLflow and prints errors about the stores; each test
plants a unique secret and then looks for it everywhere it could land: MLflow params, tags,
downloaded artifacts, the raw bytes of the MLflow store, stdout, stderr and log records. A failure
means a password leaked to anyone who can read the MLflow UI, a terminal or a CI log.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.tracking import Tracker

SECRET = "pw-7f3a9c-never-log"
STORAGE = f"postgresql://trainer:{SECRET}@127.0.0.1:1/optuna"
TRACKING = f"https://trainer:{SECRET}@mlflow.example.invalid"


def _space_text() -> str:
    space = tiny_space_dict(**{"study.storage": STORAGE})
    space["tracking"] = {"uri": TRACKING, "experiment": "secrets"}
    return yaml.safe_dump(space, sort_keys=False)


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_log_space_masks_passwords_in_artifact_and_params(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    store = tmp_path / "mlflow.db"
    tracker = Tracker(f"sqlite:///{store}", "secrets", tmp_path / "mlartifacts", "s")
    tracker.log_space(_space_text(), {"study": "s", "storage": STORAGE, "tracking_uri": TRACKING})
    tracker.close()

    run = tracker.client.get_run(tracker.parent_id)
    logged = {**run.data.params, **run.data.tags}
    assert not [k for k, v in logged.items() if SECRET in v], logged
    assert run.data.params["storage"] == "postgresql://trainer:***@127.0.0.1:1/optuna"  # still says which store

    downloaded = Path(tracker.client.download_artifacts(tracker.parent_id, "", str(tmp_path / "dl")))
    space_yaml = (downloaded / "space.yaml").read_text()
    assert SECRET not in space_yaml and "trainer:***@127.0.0.1:1/optuna" in space_yaml
    assert _files_containing(tmp_path, SECRET) == [], "the secret is in the MLflow store or its artifacts"
    assert SECRET not in caplog.text


def test_unreachable_storage_error_masks_the_password(tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    path = write_space(tmp_path, _space_text())
    code = main(["run", str(path), "--output-dir", str(tmp_path / "out"), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "study.storage" in err and "trainer:***@127.0.0.1:1" in err, err
    assert SECRET not in out + err + caplog.text


def test_unreachable_tracking_uri_error_masks_the_password(tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    space = tiny_space_dict()
    space["tracking"] = {"uri": f"http://trainer:{SECRET}@127.0.0.1:9"}
    path = write_space(tmp_path, space)
    code = main(["run", str(path), "--output-dir", str(tmp_path / "out"), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "tracking.uri" in err and "trainer:***@127.0.0.1:9" in err, err
    assert SECRET not in out + err + caplog.text
    # The manifest keeps the real URI on purpose (a later 'precsearch ui' needs it); nothing else in the
    # output directory may hold it.
    leaked = [p.name for p in _files_containing(tmp_path / "out", SECRET)]
    assert leaked in ([], ["precsearch.json"]), leaked
