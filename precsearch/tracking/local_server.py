"""A local ``mlflow server`` for the duration of a parallel run.

Several worker processes must not write one sqlite file through MLflow at
once; they log over HTTP to one tracking server instead. When a study's
tracking store is a local sqlite file, ``precsearch run --workers N`` starts
this server on the loopback interface and a free port, on that file, and
stops it when the run ends. The server dies with the run (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from precsearch.errors import UserError
from precsearch.utils.processes import dying_with_parent, stop_group
from precsearch.tracking.server import LOOPBACK, mlflow_server_command


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until_up(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    """True once ``url``/health answers 200; False after ``timeout_s`` or if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


class LocalTrackingServer:
    """``with LocalTrackingServer(store_uri, log_path) as url:`` serves ``store_uri`` at ``url``."""

    def __init__(self, store_uri: str, log_path: Path, start_timeout_s: float = 90.0):
        self.store_uri, self.log_path, self.start_timeout_s = store_uri, Path(log_path), start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> str:
        port = free_port()
        self.url = f"http://{LOOPBACK}:{port}"
        cmd = mlflow_server_command(self.store_uri, host=LOOPBACK, port=port, workers=1)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        # without MLflow's job runners (seven huey processes importing MLflow beside the probes, for GenAI jobs
        # a study never asks for), which also made stopping the server take seconds
        env = os.environ | {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
                            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = subprocess.Popen(dying_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        log.close()
        if not wait_until_up(self.url, self.start_timeout_s, self.proc):
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-800:]
            raise UserError(f"the local MLflow server did not start within {self.start_timeout_s:.0f} s; "
                            f"its log ({self.log_path}) ends:\n{tail}", field="tracking.uri")
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, grace_s: float = 0.2) -> None:
        """Stop the server and its uvicorn workers (its process group); SIGKILL after ``grace_s``. Called when
        the workers that logged through it have exited: nothing is mid-write (after Ctrl-C the study stops
        it at once, its 0.2 s of orderly shutdown were a fifth of the stop)."""
        if self.proc is not None and self.proc.poll() is None:
            stop_group(self.proc, grace_s=grace_s)
        self.proc = None
