"""``deferred_signals``: Ctrl-C held back while a trial is closed, and raised right after."""

import signal
import threading

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
