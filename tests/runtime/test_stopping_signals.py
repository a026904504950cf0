"""``deferred_signals``: Ctrl-C held back while a trial is closed, and raised right after."""

import signal
import threading
import time

import pytest

from precsearch.runtime.stopping import deferred_signals


def _interrupting(signum, frame):
    raise KeyboardInterrupt


@pytest.fixture
def sigint_raises():
    previous = signal.signal(signal.SIGINT, _interrupting)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_during_the_block_is_raised_after_it(sigint_raises):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_signals():
            # to the main thread, which blocks it, so it waits in the kernel (a signal to the process could go
            # to another thread of pytest's and reach its handler whenever that thread next runs)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            done.append("write 1")
            done.append("write 2")
    assert done == ["write 1", "write 2"]


def test_a_ctrl_c_the_interpreter_already_took_is_held_too(sigint_raises):
    """A signal the C-level handler caught just before the block runs its Python handler at the next bytecode,
    inside the block: the handler in place then (here called directly, as the interpreter would) must only
    note it, and the interrupt comes after the block."""
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_signals():
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            done.append("write")
    assert done == ["write"]
    assert signal.getsignal(signal.SIGINT) is _interrupting  # the handler is back


def test_nothing_is_raised_without_a_signal(sigint_raises):
    with deferred_signals():
        pass
    assert signal.getsignal(signal.SIGINT) is _interrupting


# a worker that SIGTERM interrupts while a non-daemon thread it started still runs: without the deadline, the
# interpreter's exit waits on that thread for ever
_STUCK_AFTER_SIGTERM = """
import sys, threading, time
from precsearch.runtime.stopping import StopRequest
def beating_for_ever():
    while True:
        time.sleep(0.1)
with StopRequest(term_grace_s=float(sys.argv[1])):
    threading.Thread(target=beating_for_ever).start()
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_process_sigterm_cannot_end_ends_itself_after_the_grace_and_says_where_it_waited():
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _STUCK_AFTER_SIGTERM, "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert 1.5 < time.monotonic() - sent < 30
    assert "Timeout (0:00:02)!" in err and "beating_for_ever" in err


def test_a_process_that_ends_in_time_after_sigterm_is_not_held_by_the_deadline():
    import subprocess
    import sys
    import time

    code = ("import time\nfrom precsearch.runtime.stopping import StopRequest\n"
            "with StopRequest(term_grace_s=60):\n    print('ready', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 20  # the daemon timer does not keep it for its 60 s
    assert "KeyboardInterrupt" in err and "Timeout" not in err


def test_the_second_ctrl_c_quiets_the_storages_cleanup_errors(caplog):
    """Under load the second Ctrl-C landed mid-query and SQLAlchemy printed 'Error closing cursor' ('Cannot operate
    on a closed database') with its traceback ahead of the resume hint (CI, 2026-12-07): the first press leaves
    that logger as it was, the second silences it for the rest of the ending run."""
    import logging

    from precsearch.runtime.stopping import StopRequest

    pool = logging.getLogger("sqlalchemy.pool.impl.QueuePool")  # a pool's logger, under sqlalchemy.pool
    parent = logging.getLogger("sqlalchemy.pool")
    level = parent.level
    try:
        parent.setLevel(logging.NOTSET)
        stop = StopRequest(say=lambda line: None)
        stop._on_sigint(signal.SIGINT, None)  # the first press: a stop is asked for, nothing raised
        assert stop.requested and pool.isEnabledFor(logging.ERROR)
        with pytest.raises(KeyboardInterrupt):
            stop._on_sigint(signal.SIGINT, None)
        assert not pool.isEnabledFor(logging.ERROR)
    finally:
        parent.setLevel(level)


def test_an_interrupt_that_lands_in_a_gc_callback_is_raised_again_without_a_traceback(capsys):
    """The second Ctrl-C landed in a weakref callback that garbage collection ran (SQLAlchemy's, CI 2026-12-07):
    Python printed 'Exception ignored' with a traceback and went on. Under a StopRequest it is raised again at
    the next line, and nothing is printed."""
    import gc
    import sys
    import weakref

    from precsearch.runtime.stopping import StopRequest

    class Thing:
        pass

    def callback_the_interrupt_lands_in(ref):
        stop._on_sigint(signal.SIGINT, None)  # as the interpreter would run the handler inside the callback

    hook = sys.unraisablehook
    with StopRequest(say=lambda line: None) as stop:
        stop.requested = True  # the first press
        thing = Thing()
        ref = weakref.ref(thing, callback_the_interrupt_lands_in)
        reached = []
        with pytest.raises(KeyboardInterrupt):
            del thing
            gc.collect()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the re-delivered signal's handler runs within milliseconds
                reached.append(1)
                time.sleep(0.001)
        assert len(reached) < 1000 and ref() is None
    assert sys.unraisablehook is hook  # put back on exit
    assert "Traceback" not in capsys.readouterr().err


def test_other_unraisable_errors_still_reach_the_hook_that_was_there():
    import sys
    from types import SimpleNamespace

    from precsearch.runtime.stopping import StopRequest

    seen = []
    previous, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with StopRequest(say=lambda line: None) as stop:
            stop.requested = True
            args = SimpleNamespace(exc_type=ValueError, exc_value=ValueError("x"), exc_traceback=None,
                                   err_msg=None, object=None)
            sys.unraisablehook(args)
        assert seen == [args]
    finally:
        sys.unraisablehook = previous


def test_an_interrupt_to_deliver_again_is_dropped_once_the_stop_has_ended(sigint_raises):
    """The run ended (handlers put back) before the timer fired: nothing is left to interrupt, so nothing is sent."""
    from types import SimpleNamespace

    from precsearch.runtime.stopping import REDELIVER_S, StopRequest

    with StopRequest(say=lambda line: None) as stop:
        stop.requested = True
        stop._on_unraisable(SimpleNamespace(exc_type=KeyboardInterrupt, exc_value=KeyboardInterrupt(),
                                            exc_traceback=None, err_msg=None, object=None))
    time.sleep(REDELIVER_S * 6)  # past the timer: with SIGINT raising again (the fixture), a send would raise here
