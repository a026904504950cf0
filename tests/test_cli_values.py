"""Every numeric or list flag of the CLI refuses values that would run nothing, everything, or the wrong thing.

Issue 16, class 8: ``--n-trials 0`` used to run the file's count, ``-1`` was accepted, ``--gpus`` on a CPU
machine ran on the CPU, ``--workers 1000`` started 1000 processes on 2 cores. Each refusal must exit 2 with
one line naming the flag, before anything runs (no output directory is created).
"""

from __future__ import annotations

import pytest
import torch

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.cli_checks import usable_cpus


def _refused(capsys, argv: list[str], flag: str, fragment: str) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert flag in err and fragment in err, err


@pytest.mark.parametrize("extra, flag, fragment", [
    (["--n-trials", "0"], "--n-trials", "1 or more"),
    (["--n-trials", "-1"], "--n-trials", "1 or more"),
    (["--workers", "0"], "--workers", "1 or more"),
    (["--workers", "-3"], "--workers", "1 or more"),
    (["--workers", "1000"], "--workers", "CPU cores"),
    (["--workers", "2", "--gpus", "0"], "--workers", "--gpus"),
], ids=["n_trials_0", "n_trials_negative", "workers_0", "workers_negative", "workers_1000", "workers_with_gpus"])
def test_run_flags_are_refused_before_anything_runs(tmp_path, capsys, extra, flag, fragment):
    path = write_space(tmp_path, tiny_space_dict())
    out = tmp_path / "out"
    _refused(capsys, ["run", str(path), "--output-dir", str(out), "--no-progress", *extra], flag, fragment)
    assert not out.exists(), "a refused run must not create its output directory"


def test_workers_up_to_twice_the_cpu_count_are_accepted_and_no_more():
    from precsearch.cli_checks import check_workers
    from precsearch.errors import UserError

    check_workers(2 * usable_cpus(), False, 1)  # raises if refused
    with pytest.raises(UserError, match="--workers"):
        check_workers(2 * usable_cpus() + 1, False, 1)
    with pytest.raises(UserError, match="probe processes"):
        check_workers(usable_cpus(), False, 4)  # each probe on 4 processes


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("gpus", ["0", "0,1", "all"])
def test_gpus_without_cuda_is_refused(tmp_path, capsys, gpus):
    path = write_space(tmp_path, tiny_space_dict())
    _refused(capsys, ["run", str(path), "--output-dir", str(tmp_path / "out"), "--gpus", gpus], "--gpus", "CUDA")


@pytest.mark.parametrize("argv, flag, fragment", [
    (["worker", "--study", "s", "--n-trials", "0"], "--n-trials", "1 or more"),
    (["export", "--trial", "-1"], "--trial", "0 or more"),
    (["export", "--trial", "0", "--n-layers", "0"], "--n-layers", "1 or more"),
    (["export", "--trial", "0", "--n-layers", "1000000"], "--n-layers", "at most 1024"),  # hung enumerating layers
    (["export", "--trial", "0", "--format", "megatron", "--pipeline-parallel", "0"], "--pipeline-parallel",
     "1 or more"),
    (["export", "--pick", "max-memory", "--max-instability", "-0.1"], "--max-instability", ">= 0"),
    (["export", "--pick", "max-memory", "--max-instability", "nan"], "--max-instability", ">= 0"),
    (["ui", "--port", "0"], "--port", "1..65535"),
    (["ui", "--port", "70000"], "--port", "1..65535"),
], ids=["worker_n_trials_0", "export_trial_negative", "export_n_layers_0", "export_n_layers_million",
        "pipeline_parallel_0", "max_instability_negative",
        "max_instability_nan", "port_0", "port_70000"])
def test_other_commands_refuse_bad_values(tmp_path, capsys, argv, flag, fragment):
    if argv[0] != "worker":
        argv = [*argv, "--output-dir", str(tmp_path)]
    _refused(capsys, argv, flag, fragment)


def test_worker_on_a_study_stored_with_a_space_now_refused_says_so(tmp_path, capsys, monkeypatch):
    """A study stored by an older precsearch (here: a study name with a quote, which MLflow's filters
    cannot carry; a space has been valid since issue 34) must not end in a pydantic traceback when a
    worker joins it."""
    import optuna

    from precsearch.config.loader import parse_space

    space = parse_space(tiny_space_dict()).model_dump(mode="json")
    space["study"]["name"] = "it's"
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="it's", storage=url)
    study.set_user_attr("space", space)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    capsys.readouterr()  # Optuna's own log line about creating the study
    _refused(capsys, ["worker", "--study", "it's", "--storage", url, "--output-dir", str(tmp_path / "w")],
             "--study", "study.name")
