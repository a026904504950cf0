"""A run that outlives a test's timeout says where it waits: SIGUSR1 prints a precsearch process's stacks."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from _cluster import finish
from precsearch.utils.processes import dump_stacks

# a "run" that registers the dump, starts a child that does not, and blocks in a function the dump must name
_STUCK = """
import subprocess, sys, time
from precsearch.utils.processes import dump_stacks_on_signal
dump_stacks_on_signal()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("started", child.pid, flush=True)
def waiting_for_a_lost_trial():
    time.sleep(120)
waiting_for_a_lost_trial()
"""


def _start() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", _STUCK], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    first = proc.stdout.readline().split()
    assert first[:1] == ["started"], first
    return proc, int(first[1])


def test_a_process_asked_for_its_stacks_prints_them_and_goes_on():
    proc, child = _start()
    try:
        time.sleep(0.5)  # into the function
        tree = dump_stacks(proc.pid, settle_s=1.0)
        assert proc.poll() is None, "SIGUSR1 must not end a process that registered the dump"
        assert psutil.Process(child).is_running(), "a child without the handler is listed, not signalled"
        assert [line.split()[0] for line in tree] == [str(proc.pid), str(child)]
    finally:
        psutil.Process(child).kill()
        proc.kill()
    out = proc.communicate()[0]
    assert "waiting_for_a_lost_trial" in out and "Current thread" in out


def test_finish_fails_a_run_past_its_timeout_with_its_stacks_and_kills_its_tree(tmp_path):
    proc, child = _start()
    earlier = tmp_path / "first_run.log"
    earlier.write_text("an earlier run's worker said this\n")
    with pytest.raises(pytest.fail.Exception) as failed:
        finish(proc, 1.0, logs=(earlier, tmp_path / "never_written.log"))
    message = str(failed.value)
    assert "still running after 1 s" in message and "waiting_for_a_lost_trial" in message
    assert "an earlier run's worker said this" in message and "never_written" not in message
    assert f"{child} " in message  # the tree's listing
    assert proc.poll() is not None
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
