"""``precsearch ui``: an MLflow server on a study's store, stopped with everything it started.

``mlflow server`` starts worker processes of its own. The server runs in its own process
group, so that Ctrl-C, SIGTERM or SIGHUP to ``precsearch ui`` stops the whole group (no
orphan keeps serving the port), and dies with ``precsearch ui`` even when that is killed
(``PR_SET_PDEATHSIG``). A port already taken is refused before the URL is printed.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
from collections.abc import Callable

from precsearch.errors import UserError
from precsearch.tracking.local_server import wait_until_up
from precsearch.utils.processes import dying_with_parent, stop_group

_START_S = 600.0  # a loaded machine took minutes to start MLflow's workers

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stop(Exception):
    """A stop signal reached ``precsearch ui``."""


def check_port(host: str, port: int) -> None:
    """Refuse a ``host``/``port`` that cannot be bound now (taken, or not an address of this machine)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not "taken"
            s.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is already in use (another 'precsearch ui' or server?); "
                            "stop it or give another --port", field="--port") from None
        raise UserError(f"cannot bind {host}:{port}: {exc.strerror or exc}", field="--host") from None


def serve(cmd: list[str], env: dict[str, str] | None = None, url: str = "",
          ready: Callable[[], None] | None = None) -> int:
    """Run the server ``cmd`` until it exits (its status) or a stop signal arrives (0, group stopped).

    ``ready`` is called once ``url`` answers: the links it prints come after the server's start-up lines,
    so they stay the last thing on screen.
    """
    proc = subprocess.Popen(dying_with_parent(cmd), start_new_session=True,
                            env=None if env is None else os.environ | env)

    def stop(signum, frame):
        raise _Stop

    saved = {s: signal.signal(s, stop) for s in _STOP_SIGNALS}
    try:
        if ready is not None:
            if url:
                wait_until_up(url, _START_S, proc)
            if proc.poll() is None:  # up, or slow to start: the links are printed either way
                ready()
        return proc.wait()
    except _Stop:
        stop_group(proc)
        return 0
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        stop_group(proc)
