"""``Tracker.close_stopped``: a stopping worker closes the study's run in one attempt and never raises."""

from types import SimpleNamespace

from precsearch.tracking.mlflow_tracker import Tracker


class _Client:
    def __init__(self, error: Exception | None = None):
        self.error, self.calls = error, []

    def set_terminated(self, run_id, status):
        self.calls.append((run_id, status))
        if self.error is not None:
            raise self.error


def test_the_study_run_is_closed_killed_in_one_attempt():
    client, said = _Client(), []
    Tracker.close_stopped(SimpleNamespace(raw_client=client, parent_id="p"), said.append)
    assert client.calls == [("p", "KILLED")] and said == []


def test_a_locked_store_costs_one_attempt_and_a_line_not_an_error():
    """A second Ctrl-C inside one of the process's own SQLite writes can leave the store locked until the
    process exits: the retrying client would wait a minute and end the Ctrl-C in a store error."""
    client, said = _Client(RuntimeError("(sqlite3.OperationalError) database is locked")), []
    Tracker.close_stopped(SimpleNamespace(raw_client=client, parent_id="p"), said.append)
    assert client.calls == [("p", "KILLED")]
    assert len(said) == 1 and "RuntimeError" in said[0] and "stays RUNNING until the study runs again" in said[0]
