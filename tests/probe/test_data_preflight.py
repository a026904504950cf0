"""Bad data is found once, in the parent, before any trial (issue 16, class 3).

Each case writes a broken data file next to a space file that points at it; ``validate`` and ``run``
must exit 2 with one line naming the data file and the field to change, and ``run`` must spend no
trial. Before, these were found only inside the probe process: the run printed the child's traceback,
failed every trial, exited 0, and after the data was fixed said all its trials were finished.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import optuna
import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.space import Space
from precsearch.policy import Policy
from precsearch.runtime.executor import ProbeExecutor, ProbeSetupFailed

# cpu_smoke's probe: seq_len 32, micro_batch 4, eval_batches 2, vocab 256
NEED = 2 * 4 * 32 + 1 + 32 + 1


def _npy(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


def _corrupt_npy(d: Path) -> Path:
    (d / "t.npy").write_bytes(b"\x93NUMPY garbage, not a header" * 4)
    return d / "t.npy"


def _truncated_npy(d: Path) -> Path:
    path = _npy(d / "t.npy", np.arange(5000, dtype=np.uint16) % 256)
    path.write_bytes(path.read_bytes()[:600])
    return path


def _npz_named_npy(d: Path) -> Path:
    with zipfile.ZipFile(d / "t.npy", "w") as z:
        z.writestr("a.npy", b"")
    np.savez(d / "real.npz", a=np.arange(5000) % 256)
    (d / "t.npy").write_bytes((d / "real.npz").read_bytes())
    return d / "t.npy"


def _tokenizer_dir(d: Path) -> Path:
    (d / "a.txt").write_text("hello world " * 500)
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}')
    return d / "a.txt"


#: case id -> (writes the data and returns data.path, data section extras, field the error names, fragment)
CASES = {
    "corrupt_npy": (_corrupt_npy, {}, "data.path", "cannot read"),
    "truncated_npy": (_truncated_npy, {}, "data.path", "cannot read"),
    "npz_under_npy_name": (_npz_named_npy, {}, "data.path", ".npz"),
    "float_npy": (lambda d: _npy(d / "t.npy", np.ones(5000, dtype=np.float32)), {}, "data.path", "float32"),
    "empty_bin": (lambda d: (d / "t.bin").write_bytes(b"") and None or d / "t.bin", {}, "data.path", "0 tokens"),
    "odd_sized_bin": (lambda d: (d / "t.bin").write_bytes(b"\x01" * 5001) and None or d / "t.bin", {}, "data.dtype",
                      "whole number"),
    "ids_beyond_vocab": (lambda d: _npy(d / "t.npy", np.arange(5000, dtype=np.int64) % 300), {}, "data.path",
                         "token id 299"),
    "negative_ids": (lambda d: _npy(d / "t.npy", np.full(5000, -1, dtype=np.int32)), {}, "data.path", "negative"),
    "directory_as_tokens": (lambda d: (d / "shards").mkdir() or d / "shards", {}, "data.path", "not a file"),
    "too_few_tokens": (lambda d: _npy(d / "t.npy", np.arange(NEED - 10, dtype=np.uint16) % 256), {}, "data.path",
                       "too few"),
    "max_tokens_too_few": (lambda d: _npy(d / "t.npy", np.arange(50_000, dtype=np.uint16) % 256),
                           {"max_tokens": 200}, "data.max_tokens", "too few"),
    "text_dir_without_txt": (lambda d: (d / "docs").mkdir() or d / "docs", {"source": "text"}, "data.path",
                             "no .txt"),
    "corrupt_tokenizer": (_tokenizer_dir, {"source": "text", "tokenizer": "tokenizer.json"}, "data.tokenizer",
                          "cannot use tokenizer"),
}


def _space(tmp_path: Path, case: str, **overrides) -> tuple[Path, Path]:
    make, extra, _, _ = CASES[case]
    data_path = make(tmp_path)
    data = {"source": "tokens", "path": data_path.name, "eval_batches": 2, **extra}
    return write_space(tmp_path, tiny_space_dict(data=data, **overrides)), data_path


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_names_the_data_file_and_field(tmp_path, capsys, case):
    space, data_path = _space(tmp_path, case)
    code = main(["validate", str(space)])
    err = capsys.readouterr().err
    _, _, field, fragment = CASES[case]
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{field}: " in err and fragment in err, err
    shown = tmp_path / "tokenizer.json" if field == "data.tokenizer" else data_path
    assert str(shown) in err, f"the data file is not named: {err!r}"


@pytest.mark.parametrize("case", ["empty_bin", "ids_beyond_vocab"])
def test_run_spends_no_trial_on_bad_data(tmp_path, capsys, case):
    space, data_path = _space(tmp_path, case)
    out = tmp_path / "out"
    code = main(["run", str(space), "--output-dir", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and str(data_path) in err, err
    assert not (out / "optuna.db").exists(), "the study was opened (and could spend trials) before the data check"


def _bad_then_good(tmp_path: Path) -> tuple[Space, Path]:
    path = _npy(tmp_path / "t.npy", np.arange(5000, dtype=np.int64) % 300)  # ids past vocab 256
    data = {"source": "tokens", "path": str(path), "eval_batches": 2}
    space = Space.model_validate(tiny_space_dict(data=data, **{"probe.steps": 4, "probe.lr_warmup_steps": 1,
                                                               "objectives.reference_seeds": 1,
                                                               "study.n_trials": 2, "search.warmup_steps": 0}))
    return space, path


def test_probe_process_reports_bad_data_as_a_user_error_and_rereads_it(tmp_path):
    """Data that goes bad after the check (or a worker elsewhere) fails the probe process's start-up: that is a
    user error naming the field, not a traceback; once the file is fixed the next probe reads it again."""
    space, path = _bad_then_good(tmp_path)
    with ProbeExecutor(space) as ex:
        with pytest.raises(ProbeSetupFailed) as info:
            ex.run(space.probe, Policy.bf16(1.0), "t0", trial=0)
        assert info.value.field == "data.path" and "token id 299" in str(info.value)
        _npy(path, np.arange(5000, dtype=np.int64) % 256)
        assert len(ex.run(space.probe, Policy.bf16(1.0), "t0", trial=0).losses) == 4


def test_a_study_stopped_by_bad_data_runs_its_trials_once_the_data_is_fixed(tmp_path):
    """The trial the bad data stopped is not counted as finished: after the fix, the re-run runs n_trials."""
    from precsearch.errors import UserError
    from precsearch.runtime.study import run_study

    space, path = _bad_then_good(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(UserError, match="data.path"):
        run_study(space, "", out, progress=False)
    study = optuna.load_study(study_name=space.study.name, storage=f"sqlite:///{out / 'optuna.db'}")
    states = [t.state for t in study.get_trials()]
    # queued, not run: the failed trial's copy and the rest of its proposed batch (precsearch.search.proposals)
    waiting = states.count(optuna.trial.TrialState.WAITING)
    assert optuna.trial.TrialState.COMPLETE not in states and waiting <= space.study.n_trials
    _npy(path, np.arange(5000, dtype=np.int64) % 256)
    rows = run_study(space, "", out, progress=False)
    assert len(rows) == 2
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 2


def test_any_start_up_failure_of_the_probe_process_is_reported_with_its_field():
    """Whatever stops the probe process from loading its space recurs for every probe: it is reported (and the
    run stopped) instead of failing each trial with 'exited with status 1'. The field says where to look."""
    from precsearch.backends import BackendUnavailable
    from precsearch.errors import DataError
    from precsearch.runtime.executor import _setup_problem

    assert _setup_problem(DataError("t.bin holds only 0 tokens", field="data.path")) == (
        "data.path", "t.bin holds only 0 tokens")
    assert _setup_problem(BackendUnavailable("transformer_engine is not installed"))[0] == "backend"
    field, message = _setup_problem(RuntimeError("boom"))
    assert field == "probe" and message.startswith("RuntimeError: boom")
