"""The regime check runs in a real study, after the BF16 references and before the first trial's probe.

If these fail, a study with ``objectives.regime_check: refuse`` would run trials on a spiking BF16
reference (or crash with a traceback instead of exit 2), or ``warn`` would stay silent.
"""

from __future__ import annotations

import contextlib
import io
import logging

import optuna
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.runtime.workspace import Workspace

# A blow-up factor this close to 1 makes any step whose gradient norm tops the recent median a "blow-up":
# the tiny probe's noisy small batches always have one, so its BF16 reference is not smooth by construction.
SPIKY = {"probe.grad_blowup_factor": 1.0001, "objectives.reference_seeds": 1, "study.n_trials": 1}


def _run(tmp_path, mode: str, caplog) -> tuple[int, Workspace]:
    space = write_space(tmp_path, tiny_space_dict(**SPIKY, **{"objectives.regime_check": mode}))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            caplog.at_level(logging.INFO, logger="precsearch"):
        code = main(["run", str(space), "--output-dir", str(tmp_path / "out"), "--no-progress"])
    return code, Workspace.load(tmp_path / "out")


def _states(ws: Workspace) -> list[TrialState]:
    return [t.state for t in optuna.load_study(study_name=ws.study_name, storage=ws.storage_url).trials]


def test_refuse_stops_before_any_trial_probe_with_exit_2(tmp_path, caplog):
    code, ws = _run(tmp_path, "refuse", caplog)
    assert code == 2
    assert TrialState.COMPLETE not in _states(ws)  # the trial that asked for the references never ran its probe
    assert not any("is not smooth" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_warn_says_it_once_and_runs_the_trials(tmp_path, caplog):
    code, ws = _run(tmp_path, "warn", caplog)
    assert code == 0 and _states(ws) == [TrialState.COMPLETE]
    warned = [r.getMessage() for r in caplog.records if "is not smooth" in r.getMessage()]
    assert len(warned) == 1 and "gradient blow-up" in warned[0] and "probe.lr" in warned[0]
