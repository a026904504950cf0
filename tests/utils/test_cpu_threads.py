"""The CPU probe's thread count: the cores free now, and the user's setting when there is one."""

from __future__ import annotations

from precsearch.utils import cpu_threads
from precsearch.utils.cpu_threads import choose_threads, free_threads


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
    monkeypatch.setattr(cpu_threads, "load_average", lambda: 0.0)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 4)
    assert choose_threads(environ={"OMP_NUM_THREADS": "3"}) is None
    assert choose_threads(environ={"PRECSEARCH_CPU_THREADS": "2", "OMP_NUM_THREADS": "4"}) == 2
    assert choose_threads(environ={}) == 4
    monkeypatch.setattr(cpu_threads, "load_average", lambda: 3.7)
    assert choose_threads(environ={}) == 1
    assert choose_threads(processes=2, environ={"PRECSEARCH_CPU_THREADS": "0"}) == 1
