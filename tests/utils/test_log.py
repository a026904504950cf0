"""The ``precsearch`` logger prints a study's lines on the current standard output, once each."""

from __future__ import annotations

import logging

from precsearch.runtime.study_log import say


class _Ctx:
    def __init__(self, name: str = ""):
        self.name = name


def test_a_study_line_reaches_stdout_once_with_the_worker_name(capsys):
    logging.getLogger().addHandler(logging.StreamHandler())  # a root handler must not print it again
    try:
        say(_Ctx("w1"), "trial 3 failed")
        say(_Ctx(), "plain")
    finally:
        logging.getLogger().handlers.pop()
    out, err = capsys.readouterr()
    assert out == "[w1] trial 3 failed\nplain\n"
    assert err == ""
