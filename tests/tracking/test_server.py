"""Servers precsearch starts bind to the loopback interface unless the user names another address.

A failure means ``precsearch ui`` (or the local tracking server of a parallel run) would expose the
study's MLflow store, and with it everything logged, to the network by default.
"""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import precsearch
from precsearch.tracking.local_server import free_port, wait_until_up
from precsearch.cli import main
from precsearch.runtime.workspace import Workspace
from precsearch.tracking import ui
from precsearch.tracking.server import LOOPBACK, mlflow_server_command


def _option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_server_command_binds_loopback_by_default():
    cmd = mlflow_server_command("sqlite:///x/mlflow.db", port=5123)
    assert cmd[1:4] == ["-m", "mlflow", "server"]
    assert _option(cmd, "--host") == LOOPBACK == "127.0.0.1"
    assert _option(cmd, "--port") == "5123"
    assert _option(cmd, "--backend-store-uri") == "sqlite:///x/mlflow.db"


def test_server_command_takes_an_explicit_host_workers_and_artifact_dir(tmp_path):
    cmd = mlflow_server_command("sqlite:///x.db", tmp_path / "art", host="0.0.0.0", port=80, workers=1)
    assert _option(cmd, "--host") == "0.0.0.0"
    assert _option(cmd, "--workers") == "1"
    assert _option(cmd, "--default-artifact-root") == (tmp_path / "art").resolve().as_uri()


@pytest.mark.parametrize(("host", "port"), [("", 5000), (LOOPBACK, 0), (LOOPBACK, 70000)])
def test_server_command_refuses_no_host_or_a_bad_port(host, port):
    with pytest.raises(ValueError):
        mlflow_server_command("sqlite:///x.db", host=host, port=port)


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def study_dir(tmp_path) -> Path:
    Workspace(tmp_path, "s", "sqlite:///o.db", f"sqlite:///{tmp_path / 'mlflow.db'}", "s").save()
    return tmp_path


@pytest.mark.parametrize(("extra", "host"), [([], "127.0.0.1"), (["--host", "0.0.0.0"], "0.0.0.0")])
def test_ui_binds_loopback_unless_told_otherwise(study_dir, monkeypatch, capsys, extra, host):
    started = []
    monkeypatch.setattr(ui, "serve", lambda cmd, ready, **kw: started.append(cmd) or ready() or 0)
    assert main(["ui", "--output-dir", str(study_dir), *extra]) == 0
    (cmd,) = started
    assert _option(cmd, "--host") == host
    assert f"http://{host}:5000" in capsys.readouterr().out


def test_ui_with_a_bad_port_is_a_user_error(study_dir, capsys):
    assert main(["ui", "--output-dir", str(study_dir), "--port", "0"]) == 2
    assert "port" in capsys.readouterr().err


def test_only_the_server_module_builds_an_mlflow_server_command():
    """Another module assembling ``--backend-store-uri`` itself could start a server without the default."""
    package = Path(precsearch.__file__).parent
    builders = sorted(
        str(path.relative_to(package)) for path in package.rglob("*.py")
        if any(isinstance(node, ast.Constant) and node.value == "--backend-store-uri"
               for node in ast.walk(ast.parse(path.read_text())))
    )
    assert builders == ["tracking/server.py"]


def test_ui_on_a_port_in_use_is_exit_2_before_printing_the_url(study_dir, capsys):
    """A second ``precsearch ui`` used to print the URL, fail to bind, and exit 0."""
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", "--output-dir", str(study_dir), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert "http://" not in out
    assert err.count("\n") == 1 and "--port" in err and f"port {port}" in err


def _stats() -> dict[int, list[str]]:
    """pid -> the fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                stat = (entry / "stat").read_text()
                found[int(entry.name)] = stat[stat.rfind(")") + 2:].split()
        except OSError:
            pass
    return found


def _group_alive(pgid: int) -> list[int]:
    return [pid for pid, f in _stats().items() if int(f[2]) == pgid and f[0] not in ("Z", "X")]


def test_the_banner_links_every_view_and_the_front_plot_as_urls_in_model_training_mode(tmp_path):
    """The front plot was a path to click through ("run 'study-x', Artifacts, ..."), and a page opened without
    ``workflowType=machine_learning`` shows MLflow 3.17's GenAI mode."""
    from precsearch.cli import ui_banner
    from precsearch.tracking.mlflow_tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "s", tmp_path / "art", "s")
    ws = Workspace(tmp_path, "s", "sqlite:///o.db", uri, "s")
    urls = [line.split()[-1] for line in ui_banner(ws, "http://127.0.0.1:5000").splitlines() if "http://" in line]
    assert len(urls) == 5 and all("workflowType=machine_learning" in u for u in urls), urls
    assert urls[3] == (f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/{tracker.parent_id}"
                       "/artifacts/front/front.png?workflowType=machine_learning")
    assert urls[4].endswith("/artifacts/front/front.html?workflowType=machine_learning")


def test_the_server_is_started_quiet():
    """uvicorn logged one line per request (810 in a review) and four Starlette warnings per start."""
    from precsearch.tracking.server import QUIET_ENV

    cmd = mlflow_server_command("sqlite:///x.db", quiet=True)
    assert _option(cmd, "--uvicorn-opts") == "--no-access-log --log-level warning"
    assert "--uvicorn-opts" not in mlflow_server_command("sqlite:///x.db")
    env = dict(os.environ, **QUIET_ENV)
    shown = subprocess.run([sys.executable, "-c", "import mlflow.server.fastapi_app"], env=env, capture_output=True,
                           text=True, timeout=300).stderr
    assert "Warning" not in shown and "Invalid -W option" not in shown, shown


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_ui_leaves_no_server_process_behind(study_dir, signum, tmp_path):
    """SIGTERM to ``precsearch ui`` used to leave ``mlflow server`` and its workers serving the port. While it
    runs, requests write no access-log lines and the start no Starlette warnings, and the links come after the
    server's start-up lines (the study here has no experiment: the one-line banner)."""
    port = free_port()
    log = (tmp_path / "ui.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "precsearch", "ui", "--output-dir", str(study_dir), "--port",
                             str(port)], env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        assert wait_until_up(f"http://{LOOPBACK}:{port}", 120, proc), "the UI did not come up"
        for _ in range(3):
            urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=10).read()
        deadline = time.monotonic() + 30
        while "(Ctrl-C to stop)" not in (tmp_path / "ui.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.3)
        text = (tmp_path / "ui.log").read_text()
        assert "GET /health" not in text and "StarletteDeprecationWarning" not in text, text
        assert text.rstrip().splitlines()[-1].endswith("no experiment logged yet"), text
        (server,) = [pid for pid, f in _stats().items() if int(f[1]) == proc.pid]
        assert len(_group_alive(server)) >= 2  # mlflow server and the workers it started
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 15
        while _group_alive(server) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert _group_alive(server) == []
        ui.check_port(LOOPBACK, port)  # free again
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_banner_says_how_to_close_mlflows_assistant_panel(tmp_path):
    """MLflow 3.17 opens its Assistant panel over the runs table once per browser and address, and no URL
    parameter or server setting keeps it closed: the banner must say how to close it for good."""
    from precsearch.cli import ui_banner
    from precsearch.tracking.mlflow_tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    Tracker(uri, "s", tmp_path / "art", "s")
    banner = ui_banner(Workspace(tmp_path, "s", "sqlite:///o.db", uri, "s"), "http://127.0.0.1:5000")
    note = banner.splitlines()[-1]
    assert "Assistant panel" in note and "×" in note and "keeps it closed" in note, banner
