"""Real servers for the distributed tests: the PostgreSQL that tests/test_postgres.sh starts, and
``mlflow server`` processes on loopback (imported by tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from precsearch.tracking.local_server import free_port, wait_until_up
from precsearch.tracking.server import mlflow_server_command
from precsearch.utils.processes import dump_stacks

REPO = Path(__file__).resolve().parents[1]


def postgres_url() -> str:
    """The test PostgreSQL; skipped without one, failed when CI says it must be there."""
    url = os.environ.get("PRECSEARCH_TEST_POSTGRES")
    if not url:
        if os.environ.get("PRECSEARCH_REQUIRE_POSTGRES"):
            pytest.fail("PRECSEARCH_REQUIRE_POSTGRES is set but PRECSEARCH_TEST_POSTGRES is not")
        pytest.skip("no test PostgreSQL: eval \"$(bash tests/test_postgres.sh)\" starts one")
    return url


def unique_study() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


class MlflowServer:
    """A real ``mlflow server`` on loopback with its own sqlite store; restartable on the same port."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "MlflowServer":
        cmd = mlflow_server_command(f"sqlite:///{self.root / 'mlflow.db'}", self.root / "artifacts",
                                    port=self.port, workers=1)
        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        assert wait_until_up(self.url, 120, self.proc), (self.root / "server.log").read_text()[-2000:]
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def trial_runs(self, experiment: str) -> list:
        client = MlflowClient(self.url)
        exp = client.get_experiment_by_name(experiment)
        runs = client.search_runs([exp.experiment_id], max_results=5000)
        return [r for r in runs if r.data.tags.get("precsearch.role") == "trial"]


def precsearch(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "precsearch", *args], env=full_env, text=True, **popen)


def finish(proc: subprocess.Popen, timeout: float, logs: tuple[Path, ...] = ()) -> str:
    """``proc.communicate(timeout)``'s output; past the timeout, fail with where each of its precsearch
    processes waits (their stacks, printed into the same output) and its process tree, after killing it,
    and the tails of ``logs`` (an earlier run's output: its workers outlive it, no longer ``proc``'s)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        import psutil

        tree = dump_stacks(proc.pid)
        children = psutil.Process(proc.pid).children(recursive=True)
        for child in children:
            child.kill()
        proc.kill()
        out = proc.communicate()[0] or ""
        _until_dead(children)
        earlier = "".join(f"\n--- {log} (last 6000 characters) ---\n" + log.read_text(errors="replace")[-6000:]
                          for log in logs if log.exists())
        pytest.fail(f"still running after {timeout:.0f} s; its processes:\n" + "\n".join(tree)
                    + "\n--- its output, with their stacks (last 12000 characters) ---\n" + out[-12000:] + earlier)


def _until_dead(procs, timeout: float = 15.0) -> None:
    """Wait until each of ``procs`` is gone or a zombie: SIGKILL is delivered when the kernel next schedules
    the process, and on a busy machine a test that looks at once can still see it running (CI did)."""
    import psutil

    deadline = time.monotonic() + timeout
    for p in procs:
        while time.monotonic() < deadline:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)


def load(name: str, url: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except KeyError:  # the study is not created yet
            pass
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def postgres_ctl(action: str) -> None:
    """Stop or start the test PostgreSQL (tests/test_postgres.sh exports where it lives)."""
    import shutil

    pg_bin, pg_dir = os.environ.get("PRECSEARCH_PG_BIN"), os.environ.get("PRECSEARCH_PG_DIR")
    if not (pg_bin and pg_dir):
        pytest.skip("PRECSEARCH_PG_BIN/PRECSEARCH_PG_DIR unset: eval \"$(bash tests/test_postgres.sh)\"")
    cmd = [f"{pg_bin}/pg_ctl", "-D", pg_dir, "-w", "-l", f"{pg_dir}/server.log", action]
    if action == "stop":
        cmd += ["-m", "fast"]
    if os.geteuid() == 0 and shutil.which("runuser"):
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)


def trials_in_state(ws_dir: Path, state: str = "COMPLETE") -> int:
    """Trials in ``state`` while a run is live, read-only: an Optuna storage here would race its table creation."""
    import sqlite3

    db = Path(ws_dir) / "optuna.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT count(*) FROM trials WHERE state = ?", (state,)).fetchone()[0]
    except sqlite3.Error:  # tables not created yet
        return 0
