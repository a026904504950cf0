"""``precsearch worker``: join a study that ``precsearch run`` created, from any process or machine.

A worker needs only the study's name and storage URL: the space is stored in
the study (``user_attrs["space"]``), as are the MLflow experiment and the
study's parent run. Trials go to the tracking URI given (an ``mlflow
server`` that every worker reaches over HTTP, for workers on several
machines). Workers run the policies queued in seeded batches
(:mod:`precsearch.search.proposals`); each worker's own sampler, seeded apart, proposes only when
workers on several machines ask at once with the queue empty.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import optuna
from pydantic import ValidationError

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.probe.data import check_data
from precsearch.redact import redact_url
from precsearch.runtime import stores
from precsearch.runtime._optimize import work
from precsearch.runtime._tell import replay_pending
from precsearch.runtime.study_log import say
from precsearch.runtime.session import open_run
from precsearch.runtime.workspace import (
    DEFAULT_OUTPUT_ROOT,
    Workspace,
    check_dir_name,
    refuse_in_memory,
)
from precsearch.search.summary import finished_count

STORAGE_ENV = "PRECSEARCH_STORAGE"


def run_worker(study_name: str, storage_url: str | None, *, tracking_uri: str | None = None,
               output_dir: Path | None = None, n_trials: int | None = None, name: str = "",
               progress: bool = False) -> int:
    """Run trials of the stored study until it has ``n_trials`` (default: its space's) finished ones.

    Returns the number of finished trials when this worker stopped.
    """
    url = storage_url or os.environ.get(STORAGE_ENV)
    if not url:
        raise UserError(f"give --storage or set ${STORAGE_ENV}", field="--storage")
    refuse_in_memory(url, "--storage")
    if output_dir is None:
        check_dir_name(study_name, "--study")
    study = _load(study_name, url)
    try:
        space = Space.model_validate(study.user_attrs["space"])
    except ValidationError as exc:  # stored by an older precsearch that accepted it
        problem = exc.errors()[0]
        problem["msg"] = problem["msg"].removeprefix("Value error, ")
        where = ".".join(str(p) for p in problem["loc"])
        raise UserError(f"study '{study_name}' was stored with a space this precsearch refuses ({where}: "
                        f"{problem['msg']}); start a new study with a corrected space file", field="--study") from None
    check_data(space)  # this machine's copy of the data, before any trial
    tracking = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not tracking:
        raise UserError("give --tracking-uri (the study's MLflow server) or set $MLFLOW_TRACKING_URI",
                        field="--tracking-uri")
    refuse_in_memory(tracking, "--tracking-uri")
    ws = Workspace(output_dir=Path(output_dir or DEFAULT_OUTPUT_ROOT / study_name).resolve(),
                   study_name=study_name, storage_url=url, tracking_uri=tracking,
                   experiment=study.user_attrs.get("experiment", study_name),
                   dir_field="--output-dir" if output_dir is not None else "--study")
    ws.prepare()
    target = n_trials or space.study.n_trials
    offset = 1 + zlib.crc32(f"{name}:{os.getpid()}".encode()) % 100_000
    with open_run(space, ws, progress, parent_id=study.user_attrs.get("mlflow_parent_run_id"), name=name,
                  sampler_offset=offset) as ctx:
        say(ctx, f"joined study '{study_name}' at {redact_url(url)} "
                 f"({finished_count(ctx.study)} of {target} trials finished)")
        replay_pending(ctx)  # records a dead worker of this directory told Optuna but did not finish
        work(ctx, target)
        done = finished_count(ctx.study)
        if ctx.stop.requested:
            raise KeyboardInterrupt
        return done


def _load(study_name: str, url: str) -> optuna.Study:
    storage = stores.open_storage(url)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UserError(f"no study '{study_name}' in {redact_url(url)}; start it with 'precsearch run'",
                        field="--study") from None
    if "space" not in study.user_attrs:
        raise UserError(f"study '{study_name}' was not created by precsearch (no stored space)", field="--study")
    return study
