"""Probes that raise, run out of memory, produce NaN or die: recorded with the reason, the study goes on."""

from __future__ import annotations

import subprocess

import optuna
from optuna.trial import TrialState

from _cluster import finish, precsearch
from _spaces import tiny_space_dict, write_space


def test_each_kind_of_probe_failure_is_recorded_and_the_study_completes(tmp_path):
    space = write_space(tmp_path, tiny_space_dict(**{"study.n_trials": 6, "probe.steps": 6,
                                                     "objectives.reference_seeds": 1}))
    out = tmp_path / "out"
    proc = precsearch("run", str(space), "--no-progress", "--output-dir", str(out),
                      env={"PRECSEARCH_FAULTS": "0:raise,1:oom,2:nan,3:segv,4:kill"},
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = finish(proc, 900)
    assert proc.returncode == 0, log[-3000:]
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}")
    by_number = {t.number: t for t in study.trials}
    reasons = {n: by_number[n].user_attrs.get("fail_reason", "") for n in (0, 1, 3, 4)}
    assert "RuntimeError: injected fault" in reasons[0]
    assert "OutOfMemoryError" in reasons[1]
    assert "SIGSEGV" in reasons[3]
    assert "SIGKILL" in reasons[4] and "out of memory" in reasons[4]
    assert all(by_number[n].state is TrialState.FAIL for n in (0, 1, 3, 4))
    nan = by_number[2]
    assert nan.state is TrialState.COMPLETE and "non-finite" in nan.user_attrs["reason"]
    assert nan.user_attrs["score"]["diverged"] is True
    assert by_number[5].state is TrialState.COMPLETE  # the study went on after every failure
    assert len(study.trials) == 6 and "Traceback" not in log
