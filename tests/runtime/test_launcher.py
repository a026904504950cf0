"""``--workers`` / ``--gpus``: parsing, GPU slices, and a killed parallel run that resumes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _cluster import finish, precsearch, trials_in_state, wait_for
from _spaces import tiny_space_dict, write_space
from precsearch.errors import UserError
from precsearch.utils.processes import dying_with_parent
from precsearch.runtime.launcher import gpu_slices, parse_gpus
from precsearch.runtime.liveness import WorkerId
from precsearch.runtime.study import finished_count
from precsearch.runtime.workspace import Workspace


def test_parse_gpus():
    assert parse_gpus(None) is None
    assert parse_gpus("0,1, 3") == [0, 1, 3]
    for bad in ("0,0", "-1", "a,b", ","):
        with pytest.raises(UserError, match="--gpus"):
            parse_gpus(bad)


def test_gpu_slices_give_each_worker_nproc_gpus():
    assert gpu_slices([0, 1, 2, 3], 1) == [[0], [1], [2], [3]]
    assert gpu_slices([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    with pytest.raises(UserError, match="probe.nproc=2"):
        gpu_slices([0, 1, 2], 2)


def test_a_child_started_dying_with_parent_stops_when_the_parent_is_killed(tmp_path):
    """The driver's workers and mlflow server must not outlive a SIGKILLed driver."""
    marker = tmp_path / "child.pid"
    child = dying_with_parent([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"])
    code = ("import subprocess, sys, time; p = subprocess.Popen(sys.argv[2:]); "
            "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, str(marker), *child])
    wait_for(lambda: marker.exists() and marker.read_text(), 30, "the child to start")
    pid = int(marker.read_text())
    parent.kill()
    parent.wait()
    wait_for(lambda: _gone(pid), 20, "the orphaned child to stop")


def _gone(pid: int) -> bool:
    return WorkerId(WorkerId.current().host, pid, 0).is_dead()


def test_killed_parallel_run_resumes_without_losing_or_repeating_trials(tmp_path):
    """SIGKILL the driver of `run --workers 2`, re-run: finished trials kept, study completes, one run each."""
    space = write_space(tmp_path, tiny_space_dict(**{"study.n_trials": 6, "probe.steps": 20,
                                                     "objectives.reference_seeds": 1}))
    out = tmp_path / "out"
    cmd = ("run", str(space), "--workers", "2", "--no-progress", "--output-dir", str(out))
    # workers killed a moment ago may still hold the sqlite lock: wait for it like the workers do
    def storage():
        return optuna.storages.RDBStorage(f"sqlite:///{out / 'optuna.db'}",
                                          engine_kwargs={"connect_args": {"timeout": 60}})

    def done() -> int:
        return finished_count(optuna.load_study(study_name="tiny", storage=storage()))

    first_log = tmp_path / "first_run.log"  # its workers' last words (a stuck one prints its stacks at its deadline)
    with open(first_log, "w") as log:
        driver = precsearch(*cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: trials_in_state(out) >= 2, 600, "two finished trials")
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    time.sleep(2)  # the workers get SIGTERM from the kernel and close their trials
    study = optuna.load_study(study_name="tiny", storage=storage())
    first = {t.number: t.datetime_complete for t in study.trials if t.state is TrialState.COMPLETE}
    assert 2 <= len(first) < 6, "the kill must land mid-study"

    again = precsearch(*cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = finish(again, 900, logs=(first_log,))
    assert again.returncode == 0, log[-3000:]
    study = optuna.load_study(study_name="tiny", storage=storage())
    assert finished_count(study) == 6
    assert not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert {t.number: t.datetime_complete for t in study.trials if t.number in first} == first  # not re-run
    ws = Workspace.load(out)
    client = MlflowClient(ws.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(ws.experiment).experiment_id], max_results=1000)
    trial_runs = [r for r in runs if r.data.tags.get("precsearch.role") == "trial"]
    per_trial = {}
    for r in trial_runs:
        per_trial.setdefault(int(r.data.tags["trial_number"]), []).append(r.info.status)
    assert all(len(v) == 1 for v in per_trial.values()), per_trial
    assert not [r for r in trial_runs if r.info.status == "RUNNING"]
    complete = {t.number for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs}
    assert {n for n, v in per_trial.items() if v == ["FINISHED"]} == complete


def test_a_workers_lines_come_once_each_above_the_bar_and_what_the_driver_says_is_not_repeated(capsys):
    """What the driver shows of its workers: each line of theirs once, on a row of its own above the bar
    (not written into the bar's row); the stop notice, the resume hint and 'worker done' are the driver's to
    say once for all workers, so a worker's copies are dropped, as are blank lines."""
    import io

    from tqdm import tqdm

    from precsearch.runtime.launcher import Relay
    from precsearch.runtime.stopping import STOP_NOTICE

    said = [b"[w0] trial 3: memory saved 4.79% (predicted)\n", f"[w0] stopping: {STOP_NOTICE}\n".encode(),
            b"[w0] trial 4 interrupted: marked failed\n", b"\n",
            b"stopped. Re-run the same command to resume: finished trials are kept.\n",
            b"worker done: the study has 4 finished trials\n", b"42%|###  | 5/12\r[w0] after a bar\n"]
    bar = tqdm(total=12, desc="trials", file=sys.stdout, bar_format="{desc}: {n_fmt}/{total_fmt}")
    bar.update(5)
    relay = Relay(io.BytesIO(b"".join(said)))
    relay.start()
    relay.join(timeout=10)
    bar.close()
    out = capsys.readouterr().out
    shown = ["[w0] trial 3: memory saved 4.79% (predicted)", "[w0] trial 4 interrupted: marked failed",
             "[w0] after a bar"]
    for line in shown:
        assert out.count(line) == 1, out
        assert f"\r{line}\n" in out, f"{line!r} is not on a row of its own above the bar: {out!r}"
    for dropped in ("stopping:", "stopped. Re-run", "worker done", "42%"):
        assert dropped not in out, out


def test_ctrl_c_reaches_the_workers_within_a_fraction_of_a_second_and_their_last_lines_come_first(capsys):
    """The driver passes Ctrl-C on within 0.1 s (it polled once a second) and returns as soon as the workers
    exit, after their last lines; the slowest part of a stop must be the workers' own."""
    import threading
    import types

    from precsearch.runtime.launcher import _watch, start_relayed

    worker = ("import signal, sys, time\n"
              "def stop(*_):\n"
              "    print('[w{i}] trial {i} interrupted: marked failed', flush=True)\n"
              "    print('stopped. Re-run the same command to resume: finished trials are kept.', flush=True)\n"
              "    sys.exit(130)\n"
              "signal.signal(signal.SIGINT, stop)\n"
              "print('[w{i}] joined', flush=True)\n"
              "time.sleep(60)\n")
    procs = [start_relayed([sys.executable, "-c", worker.format(i=i)]) for i in range(2)]
    ctx = types.SimpleNamespace(stop=types.SimpleNamespace(requested=False),
                                study=optuna.create_study(directions=["maximize", "minimize"]))
    asked = []

    def ask() -> None:
        time.sleep(3.0)  # the workers have started and said their first line
        asked.append(time.monotonic())
        ctx.stop.requested = True

    threading.Thread(target=ask, daemon=True).start()
    try:
        codes = _watch(ctx, procs, target=4, progress=False)
    finally:
        for p in procs:
            p.kill()
    latency = time.monotonic() - asked[0]
    out = capsys.readouterr().out
    assert codes == [130, 130]
    assert latency < 1.0, f"the driver took {latency:.2f} s to end after Ctrl-C"
    for i in range(2):
        assert out.count(f"[w{i}] joined") == 1 and out.count(f"[w{i}] trial {i} interrupted") == 1, out
    assert "stopped. Re-run" not in out, "the resume hint is the driver's, said once"
