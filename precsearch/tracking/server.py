"""The command line of a local MLflow server (the UI, or a tracking server for parallel workers).

Every server precsearch starts is built here, so they all bind to the loopback
interface unless the caller names another address: a study's store holds
everything it logged, and nothing should expose it to the network by default.
"""

from __future__ import annotations

import sys
from pathlib import Path

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 5000


def mlflow_server_command(backend_uri: str, artifact_dir: Path | None = None, *, host: str = LOOPBACK,
                          port: int = DEFAULT_PORT, workers: int | None = None, quiet: bool = False) -> list[str]:
    """The argv that runs ``mlflow server`` on a study's store.

    Args:
        backend_uri: The MLflow backend store (e.g. ``sqlite:///out/mlflow.db``).
        artifact_dir: Where experiments the server creates keep their artifacts (a local folder);
            None leaves MLflow's default. Experiments precsearch creates name their own location.
        host: The address to bind; loopback unless told otherwise.
        port: The TCP port.
        workers: Server worker processes (MLflow's default when None).
        quiet: Without uvicorn's access log (one line per request: the UI makes hundreds, and the links
            ``precsearch ui`` prints scrolled away) and its start-up lines (warnings and errors stay);
            see :data:`QUIET_ENV` for MLflow's own.

    Returns:
        The command, for :func:`subprocess.call` or :class:`subprocess.Popen`.

    Raises:
        ValueError: ``host`` is empty or ``port`` is outside 1..65535.
    """
    if not host:
        raise ValueError("host must name an address to bind, e.g. 127.0.0.1")
    if not 0 < port < 65536:
        raise ValueError(f"port must be within 1..65535, got {port}")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
           "--host", host, "--port", str(port)]
    if artifact_dir is not None:
        cmd += ["--default-artifact-root", Path(artifact_dir).resolve().as_uri()]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if quiet:
        cmd += ["--uvicorn-opts", "--no-access-log --log-level warning"]
    return cmd


#: The environment of a quiet server: MLflow 3.17 imports ``starlette.middleware.wsgi``, deprecated, and each
#: uvicorn worker printed the StarletteDeprecationWarning (four per start), which a user can do nothing about.
#: Matched by its message: a ``-W`` category must be importable before the interpreter imports starlette.
#: MLflow's INFO lines (its job schedulers, a minute after the start) came after the links too.
QUIET_ENV = {"PYTHONWARNINGS": "ignore:starlette.middleware.wsgi is deprecated:UserWarning",
             "MLFLOW_LOGGING_LEVEL": "WARNING"}
