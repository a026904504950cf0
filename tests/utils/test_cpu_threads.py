"""The CPU probe's thread count: the cores other jobs leave free, measured, and the user's setting when there is one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from precsearch.utils import cpu_threads
from precsearch.utils.cpu_threads import (
    busy_elsewhere,
    choose_threads,
    cpu_ticks,
    free_threads,
    process_ticks,
    tree_ticks,
)


def test_a_busy_two_core_machine_gets_one_thread_and_an_idle_one_both():
    """Two threads on two cores that other jobs keep busy wait for each other at every barrier (the
    quickstart took 34 min so against 4 min with one); an idle machine must keep its second core."""
    assert free_threads(2, load=4.0) == 1
    assert free_threads(2, load=1.2) == 1
    assert free_threads(2, load=0.4) == 2
    assert free_threads(16, load=6.0) == 10
    assert free_threads(8, load=0.0, processes=3) == 2  # workers of one run share the free cores
    assert free_threads(1, load=-1.0) == 1


def test_the_users_setting_wins(monkeypatch):
    """A user who set OMP_NUM_THREADS (or PRECSEARCH_CPU_THREADS) asked for that count: overriding it
    would make their measurement lie."""
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda root: 0.0)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 4)
    assert choose_threads(environ={"OMP_NUM_THREADS": "3"}) is None
    assert choose_threads(environ={"PRECSEARCH_CPU_THREADS": "2", "OMP_NUM_THREADS": "4"}) == 2
    assert choose_threads(environ={}) == 4
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda root: 3.7)
    assert choose_threads(environ={}) == 1
    assert choose_threads(processes=2, environ={"PRECSEARCH_CPU_THREADS": "0"}) == 1


def test_the_load_average_is_the_fallback_where_proc_cannot_be_read(monkeypatch):
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda root: None)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads, "load_average", lambda: 3.0)
    assert choose_threads(environ={}) == 1
    monkeypatch.setattr(cpu_threads, "load_average", lambda: 0.2)
    assert choose_threads(environ={}) == 2


def test_the_runs_own_start_up_is_not_another_job(monkeypatch):
    """The measured case: a study's own processes were busy (imports, its MLflow server) and nothing else was.
    The 1-minute load average read about 1 then, and the probe took one thread of an idle 2-core machine."""
    monkeypatch.setattr(cpu_threads, "load_average", lambda: 1.1)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda root: 0.1)
    assert choose_threads(environ={}) == 2


def test_cpu_ticks_sum_the_affinitys_cpus_and_count_iowait_as_idle():
    stat = ("cpu  30 0 10 100 20 0 0 0 0 0\n"
            "cpu0 10 0 5 50 10 0 0 0 0 0\n"
            "cpu1 20 0 5 50 10 0 0 1 0 0\n"
            "intr 12345\n")
    assert cpu_ticks(stat) == (10 + 5 + 20 + 5 + 1, 75 + 86)
    assert cpu_ticks(stat, {1}) == (26, 86)


def test_a_process_stat_is_read_past_a_command_name_with_spaces_and_parentheses():
    rest = "S 7 7 7 0 -1 4194560 100 0 0 0 250 40 0 0 20 0 3 0 12345"
    assert process_ticks(f"42 (pt (main) x) {rest}") == (42, 7, 290)


def test_the_tree_holds_the_root_and_every_descendant_and_nothing_else():
    procs = [(1, 0, 1000), (10, 1, 5), (11, 10, 7), (12, 11, 9), (20, 1, 100), (13, 10, 2)]
    assert tree_ticks(procs, 10) == 5 + 7 + 9 + 2
    assert tree_ticks(procs, 12) == 9
    assert tree_ticks(procs, 99) == 0


def _fake_proc(tmp_path: Path, cpu: tuple[int, int], procs: list[tuple[int, int, int]]) -> None:
    busy, idle = cpu
    (tmp_path / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0\ncpu0 {busy} 0 0 {idle} 0 0 0 0\n")
    for pid, ppid, ticks in procs:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (p) S {ppid} 0 0 0 0 0 0 0 0 0 {ticks} 0 0 0")


def test_busy_elsewhere_takes_the_runs_tree_out_of_the_cpus_busy_time(tmp_path):
    """One CPU, 100 ticks sampled: 80 busy, of which 50 were the run's (its root 10 and child 11) and 30 another
    job's (pid 20): 0.3 of a core busy elsewhere."""
    _fake_proc(tmp_path, (0, 0), [(10, 1, 0), (11, 10, 0), (20, 1, 0)])

    def tick(_seconds):
        _fake_proc(tmp_path, (80, 20), [(10, 1, 20), (11, 10, 30), (20, 1, 30)])

    busy = busy_elsewhere(10, cpus={0}, proc=tmp_path, sleep=tick)
    assert busy == pytest.approx(0.3)
    assert busy_elsewhere(10, cpus={0}, proc=tmp_path / "none", sleep=tick) is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_a_spinning_process_outside_the_run_is_seen_busy():
    """On this machine: a process spinning outside the measured tree keeps most of a core busy."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            outside = busy_elsewhere(sleeper.pid, sample_s=0.5)  # the spinner is not in the sleeper's tree
        finally:
            sleeper.kill()
        inside = busy_elsewhere(os.getpid(), sample_s=0.5)  # the spinner is this test's child: the run's own
    finally:
        spinner.kill()
    assert outside is not None and outside >= 0.5
    assert inside is not None and inside <= outside - 0.3
