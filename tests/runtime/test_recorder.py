"""The recorder: told trials written to MLflow off the probe loop, and what survives a crash in it.

The first tests drive :class:`~precsearch.runtime.recorder.Recorder` with fake writers; the last ones run
studies through the CLI with ``PRECSEARCH_RECORD_FAULT`` killing, failing or slowing the recorder at
each point of a record, and check that no finished trial is lost and no MLflow run is left RUNNING.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _cluster import trials_in_state
from _spaces import tiny_space_dict, write_space
from precsearch.runtime import recorder
from precsearch.runtime.recorder import RecordJob, Recorder
from precsearch.runtime.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


def _job(n: int) -> RecordJob:
    return RecordJob(trial=n, trial_id=n + 1, run_id=f"run{n}", rung=12, references={"seeds": [], "stress": None},
                     worker={"host": "h", "pid": 1, "started": 0})


def test_jobs_are_written_in_order_off_the_callers_thread_and_the_front_once_per_burst(tmp_path):
    """A recorder that wrote on the caller's thread would keep the GPU idle; one that updated the front
    after every job of a burst would spend the time this module saves."""
    written, threads, fronts = [], set(), []
    gate = threading.Event()

    def write(job):
        gate.wait(10)
        written.append(job.trial)
        threads.add(threading.current_thread().name)

    rec = Recorder(write, lambda: fronts.append(len(written)), tmp_path, depth=4)
    for n in range(3):
        recorder.write_entry(tmp_path, _job(n))
        rec.submit(_job(n))
    assert written == []  # submit returned while the writer was held
    gate.set()
    rec.close()
    assert written == [0, 1, 2] and threads == {"precsearch-recorder"}
    assert fronts[-1] == 3 and len(fronts) <= 2
    assert recorder.pending(tmp_path) == []  # every entry dropped once written


def test_after_a_ctrl_c_close_waits_a_moment_then_leaves_the_records_to_the_journal(tmp_path, monkeypatch):
    """After the first Ctrl-C a record in flight (its plots: 3-5 s on a busy CPU) made the stop take seconds:
    ``close(wait_s)`` gives up after ``wait_s``, keeps the entries for the next run and ends the process
    without finalizing (the thread may be inside a store call); without a stop, close waits for every record."""
    exits = []
    monkeypatch.setattr(recorder, "_exit_without_finalizing", lambda status=130: exits.append(status))
    gate = threading.Event()
    rec = Recorder(lambda job: gate.wait(10), lambda: None, tmp_path, depth=2)
    for n in range(2):
        recorder.write_entry(tmp_path, _job(n))
        rec.submit(_job(n))
    started = time.monotonic()
    assert rec.close(wait_s=0.3) is False
    assert time.monotonic() - started < 1.0
    assert [job.trial for job in recorder.pending(tmp_path)] == [0, 1] and exits == [130]
    gate.set()

    fast = Recorder(lambda job: None, lambda: None, tmp_path / "b")
    fast.submit(_job(0))
    assert fast.close(wait_s=5.0) is True


def test_a_full_queue_holds_the_probe_loop_back(tmp_path):
    """Without the bound, a slow tracking server would let unrecorded trials pile up in memory."""
    gate = threading.Event()
    rec = Recorder(lambda job: gate.wait(10), lambda: None, tmp_path, depth=1)
    rec.submit(_job(0))  # taken by the thread, held at the gate
    time.sleep(0.3)
    rec.submit(_job(1))  # waits in the queue
    done = threading.Event()
    threading.Thread(target=lambda: (rec.submit(_job(2)), done.set()), daemon=True).start()
    assert not done.wait(0.6), "a third job was accepted while one was being written and one waited"
    gate.set()
    assert done.wait(5)
    rec.close()


def test_a_failed_write_keeps_its_entry_closes_its_run_and_stops_the_worker(tmp_path):
    """A record lost silently would leave a COMPLETE trial without its MLflow run, RUNNING forever."""
    abandoned = []

    def write(job):
        raise ConnectionError("MLflow went away")

    rec = Recorder(write, lambda: None, tmp_path, abandon=lambda job, exc: abandoned.append((job.run_id, exc)))
    recorder.write_entry(tmp_path, _job(0))
    rec.submit(_job(0))
    with pytest.raises(ConnectionError):
        rec.close()
    assert [j.run_id for j in recorder.pending(tmp_path)] == ["run0"]
    assert [run for run, _ in abandoned] == ["run0"]
    with pytest.raises(ConnectionError):  # and the next trial is not started on a broken store
        rec.submit(_job(1))
    assert [run for run, _ in abandoned] == ["run0", "run1"]  # nor its run left RUNNING


def test_inline_mode_writes_on_the_callers_thread(tmp_path):
    """PRECSEARCH_SYNC_RECORD must give the old timing, for bench_probe's before/after."""
    threads = []
    rec = Recorder(lambda job: threads.append(threading.current_thread()), lambda: None, tmp_path, inline=True)
    rec.submit(_job(0))
    assert threads == [threading.current_thread()]


def test_pending_skips_half_written_entries(tmp_path):
    """A kill during the journal's write leaves a .tmp; reading it as a job would crash every later run."""
    recorder.write_entry(tmp_path, _job(1))
    (recorder.journal_dir(tmp_path) / "run9.json").write_text('{"trial": 9')
    assert [j.trial for j in recorder.pending(tmp_path)] == [1]


# ---------------------------------------------------------------- through the CLI


def _cmd(tmp_path: Path, n_trials: int, steps: int = 12) -> tuple[list[str], Path]:
    space = write_space(tmp_path, tiny_space_dict(**{"study.n_trials": n_trials, "probe.steps": steps,
                                                     "objectives.reference_seeds": 1}))
    out = tmp_path / "out"
    return [sys.executable, "-m", "precsearch", "run", str(space), "--output-dir", str(out), "--no-progress"], out


def _env(**extra: str) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)


def _trial_runs(out: Path) -> list:
    ws = Workspace.load(out)
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name(ws.experiment)
    return [r for r in client.search_runs([exp.experiment_id], max_results=1000)
            if r.data.tags.get("precsearch.role") == "trial"]


def _complete(out: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}")
    return [t for t in study.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]


def _assert_whole(out: Path, n_trials: int) -> None:
    """Every distinct finished trial has a FINISHED run with its record; nothing is RUNNING."""
    complete = {t.number: t.user_attrs["mlflow_run_id"] for t in _complete(out)}
    assert len(complete) == n_trials
    runs = {r.info.run_id: r for r in _trial_runs(out)}
    assert not [r for r in runs.values() if r.info.status == "RUNNING"]
    for number, run_id in complete.items():
        run = runs[run_id]
        assert run.info.status == "FINISHED" and run.data.tags["trial_state"] == "COMPLETE", number
        assert "instability" in run.data.metrics and "verdict" in run.data.tags, number
    assert recorder.pending(out) == []


@pytest.mark.parametrize("point", ["before_write", "after_steps", "after_finish"])
def test_sigkill_inside_a_record_loses_no_trial_and_the_next_run_writes_it(tmp_path, point):
    """The recorder kills its own process at ``point`` of trial 0's record: Optuna holds the trial COMPLETE,
    its run is RUNNING (or FINISHED, after_finish) with its journal entry; the re-run writes the record."""
    cmd, out = _cmd(tmp_path, n_trials=2)
    first = subprocess.run(cmd, env=_env(PRECSEARCH_RECORD_FAULT=point), capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert len(_complete(out)) >= 1 and recorder.pending(out), "the kill must land after a tell"
    subprocess.run(cmd, env=_env(), check=True, capture_output=True, timeout=300)
    _assert_whole(out, 2)


def test_an_exception_inside_a_record_closes_its_run_and_the_next_run_writes_it(tmp_path):
    """A record that raises (the store gone past its retries) must not leave its run RUNNING meanwhile."""
    cmd, out = _cmd(tmp_path, n_trials=2)
    first = subprocess.run(cmd, env=_env(PRECSEARCH_RECORD_FAULT="raise:after_steps"), capture_output=True,
                           text=True, timeout=300)
    assert first.returncode != 0
    assert len(_complete(out)) >= 1  # trial 1's probe may run before trial 0's failure is seen
    assert not [r for r in _trial_runs(out) if r.info.status == "RUNNING"]
    subprocess.run(cmd, env=_env(), check=True, capture_output=True, timeout=300)
    _assert_whole(out, 2)


def _interrupt_while_recording(tmp_path: Path, presses: int) -> tuple[subprocess.CompletedProcess, Path, list]:
    """Slow records (3 s each); Ctrl-C ``presses`` times once a trial is told and its record in flight."""
    cmd, out = _cmd(tmp_path, n_trials=3, steps=40)
    proc = subprocess.Popen(cmd, env=_env(PRECSEARCH_RECORD_FAULT="slow:after_steps"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while trials_in_state(out) < 1 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    stdout, stderr = proc.communicate(timeout=120)
    told = [t.user_attrs["mlflow_run_id"] for t in _complete(out)]
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), out, told


def test_ctrl_c_while_a_record_is_in_flight_ends_within_seconds_and_the_rerun_writes_the_record(tmp_path):
    """One Ctrl-C: the probe in flight stops and the process ends without waiting out the 3 s record (it waited
    for it); the record stays journalled and the re-run writes it whole."""
    done, out, told = _interrupt_while_recording(tmp_path, presses=1)
    assert done.returncode == 130, done.stderr[-2000:]
    assert told, "Ctrl-C must land after a tell"
    assert "written when the study resumes" in done.stdout + done.stderr
    assert recorder.pending(out), "the record cut short must stay in the journal"
    cmd, _ = _cmd(tmp_path, n_trials=3, steps=40)
    subprocess.run(cmd, env=_env(), check=True, capture_output=True, timeout=600)
    _assert_whole(out, 3)


def test_second_ctrl_c_while_recording_leaves_the_record_to_the_next_run(tmp_path):
    """Two Ctrl-C: out at once, possibly mid-record; the re-run writes what was cut short."""
    done, out, told = _interrupt_while_recording(tmp_path, presses=2)
    assert done.returncode in (130, -signal.SIGINT), done.stderr[-2000:]
    assert told
    cmd, _ = _cmd(tmp_path, n_trials=3, steps=40)
    subprocess.run(cmd, env=_env(), check=True, capture_output=True, timeout=600)
    _assert_whole(out, 3)
