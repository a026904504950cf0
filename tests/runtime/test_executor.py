"""Probes in a child process: same numbers as in-process, and crashes reported instead of spread."""

from __future__ import annotations

import os
import time

import pytest

from _spaces import tiny_space_dict
from precsearch.config.space import Space
from precsearch.policy import Policy
from precsearch.runtime.executor import ProbeCrashed, ProbeExecutor, ProbeFailed
from precsearch.runtime.probe_host import FAULTS_ENV, ProbeHost, fault_for


@pytest.fixture(scope="module")
def space() -> Space:
    return Space.model_validate(tiny_space_dict(**{"probe.steps": 4, "objectives.reference_seeds": 1}))


@pytest.fixture(scope="module")
def executor(space):
    with ProbeExecutor(space) as ex:
        yield ex


def test_child_result_matches_an_in_process_probe(space, executor):
    """The process boundary must not change the numbers: same seed, same losses."""
    policy = Policy.bf16(1.0)
    steps = []
    child = executor.run(space.probe, policy, "ref", on_step=lambda s, loss, g: steps.append(s))
    local = ProbeHost(space).run({"probe": space.probe.model_dump(mode="json"), "policy": policy.to_dict()})
    assert child.losses == local.losses
    assert child.eval_loss == local.eval_loss
    assert steps == [0, 1, 2, 3]  # progress streamed per step


def test_exception_in_probe_is_probe_failed_and_child_survives(space, executor, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "7:raise")
    executor.close()  # the next child inherits the variable
    with pytest.raises(ProbeFailed, match="RuntimeError: injected fault"):
        executor.run(space.probe, Policy.bf16(1.0), "t7", trial=7)
    assert executor.run(space.probe, Policy.bf16(1.0), "t8", trial=8).losses  # same child, still usable


@pytest.mark.parametrize("fault, signal_name", [("kill", "SIGKILL"), ("segv", "SIGSEGV")])
def test_a_dying_probe_is_probe_crashed_and_the_next_runs(space, monkeypatch, fault, signal_name):
    monkeypatch.setenv(FAULTS_ENV, f"3:{fault}")
    with ProbeExecutor(space) as ex:
        with pytest.raises(ProbeCrashed, match=signal_name):
            ex.run(space.probe, Policy.bf16(1.0), "t3", trial=3)
        assert len(ex.run(space.probe, Policy.bf16(1.0), "t4", trial=4).losses) == 4  # a fresh child


def test_timeout_kills_the_probe(space):
    slow = space.probe.model_copy(update={"steps": 100_000})
    with ProbeExecutor(space, timeout_s=3) as ex:
        with pytest.raises(ProbeCrashed, match="time limit of 3 s"):
            ex.run(slow, Policy.bf16(1.0), "slow")


def test_fault_spec_parsing(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "1:oom, 2:nan,3:bogus")
    assert [fault_for(n) for n in (0, 1, 2, 3, None)] == [None, "oom", "nan", None, None]
    monkeypatch.delenv(FAULTS_ENV)
    assert fault_for(1) is None and os.environ.get(FAULTS_ENV) is None


def test_a_stop_request_kills_the_probe_in_flight_within_a_second(space):
    """Ctrl-C sets the worker's stop flag; a probe must not run on to its end (issue 16: 280 s)."""
    from precsearch.runtime.executor import ProbeInterrupted

    long = space.probe.model_copy(update={"steps": 100_000})
    stop_at: list[float] = []

    def on_step(step, loss, grad_norm):
        if step == 2:
            stop_at.append(time.monotonic())

    with ProbeExecutor(space, stop_requested=lambda: bool(stop_at)) as ex:
        with pytest.raises(ProbeInterrupted):
            ex.run(long, Policy.bf16(1.0), "long", on_step=on_step)
        assert time.monotonic() - stop_at.pop() < 1.0
        assert len(ex.run(space.probe, Policy.bf16(1.0), "next").losses) == 4  # a fresh child serves the next


def test_a_released_child_exits_on_its_own_and_a_later_probe_gets_a_fresh_one(space):
    """release() lets the study write its last records while the child frees its memory: the child ends
    without a kill, close() only waits for it, and a probe asked for after a release is still served."""
    with ProbeExecutor(space) as ex:
        ex.run(space.probe, Policy.bf16(1.0), "first")
        child = ex._proc
        ex.release()
        child.join(timeout=30)
        assert child.exitcode == 0  # it exited by itself (os._exit(0)), nobody killed it
        assert len(ex.run(space.probe, Policy.bf16(1.0), "after").losses) == 4
        assert ex._proc is not child
    assert ex._released == [] and ex._proc is None


def test_a_started_executor_watches_the_stop_flag_given_later(space):
    """``precsearch run`` starts the probe process before its study exists; the study's stop flag, given
    with watch(), must still kill a probe in flight."""
    from precsearch.runtime.executor import ProbeInterrupted, probe_process

    ex = probe_process(space)
    try:
        stop = []
        ex.watch(lambda: bool(stop))
        with pytest.raises(ProbeInterrupted):
            ex.run(space.probe.model_copy(update={"steps": 100_000}), Policy.bf16(1.0), "long",
                   on_step=lambda step, loss, g: stop.append(step) if step == 1 else None)
    finally:
        ex.close()
