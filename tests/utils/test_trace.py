"""The opt-in timeline (``PRECSEARCH_TRACE``) and where a study's time went by it (runtime.timeline)."""

import multiprocessing as mp

import pytest

from precsearch.runtime.timeline import probe_time
from precsearch.utils import trace


def test_nothing_is_written_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(trace.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with trace.span("quiet"):
        pass
    trace.write("quiet", 0.0, 1.0)
    assert list(tmp_path.iterdir()) == []


def test_a_span_is_written_when_it_ends_also_when_it_raises(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace.ENV, str(path))
    with pytest.raises(ValueError), trace.span("failing", trial=3):
        raise ValueError("boom")
    (s,) = trace.read(path)
    assert s["name"] == "failing" and s["trial"] == 3 and s["role"] == "study" and s["t1"] >= s["t0"]


def _child() -> None:
    trace.set_role("probe")  # the trace file comes with the environment, as for the probe process
    for i in range(200):
        trace.write("child", float(i), float(i) + 0.5, filler="x" * 300)


def test_lines_of_several_processes_do_not_interleave(tmp_path, monkeypatch):
    """Each process appends whole lines: 2 x 200 lines of ~400 bytes come back as 400 spans."""
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace.ENV, str(path))
    procs = [mp.get_context("spawn").Process(target=_child) for _ in range(2)]
    for p in procs:
        p.start()
    for i in range(200):
        trace.write("parent", float(i), float(i) + 0.25)
    for p in procs:
        p.join(timeout=60)
    spans = trace.read(path)
    assert len(spans) == 600 and len(path.read_text().splitlines()) == 600
    assert {s["role"] for s in spans} == {"study", "probe"}


def _span(name, t0, t1, role="study"):
    return {"name": name, "role": role, "t0": t0, "t1": t1, "pid": 1}


def test_the_probe_process_time_is_split_into_its_work_and_what_it_waited_for():
    """A constructed 10 s run: the probe process starts (0-3 s) while the study starts up (0-2) and opens its
    stores (2-4); one request 4-8 s (a probe 4-6, a reading 6-7.5, sending 7.5-8) inside the study's wait
    ("trial probe" is not charged); then the study records (8-9) and nothing is traced (9-10)."""
    spans = [
        _span("study process: start-up", 0, 2), _span("open stores", 2, 4),
        _span("probe process: start", 0, 1, "probe"), _span("probe process: set-up", 1, 3, "probe"),
        _span("trial probe", 3.5, 8), _span("probe request", 4, 8, "probe"), _span("probe", 4, 6, "probe"),
        _span("fixed-state reading", 6, 7.5, "probe"), _span("record", 8, 9),
    ]
    parts = probe_time(spans, 0.0, 10.0)
    assert parts == pytest.approx({
        "idle: probe process: start": 1.0, "idle: probe process: set-up": 2.0,  # charged first: nothing ran yet
        "idle: open stores": 1.0,                      # 3-4: the child is ready, the study still opening
        "busy: probe": 2.0, "busy: fixed-state reading": 1.5, "busy: other": 0.5,
        "idle: record": 1.0, "idle: other": 1.0,
    })
    assert sum(parts.values()) == pytest.approx(10.0)


def test_a_reading_is_split_into_its_parts_and_the_rest_stays_the_reading():
    """A 4 s reading (6-10 s): its BF16 side at 6-7 (a first trial: the BF16 run 6-6.5, one state's BF16
    gradients 6.5-6.7 and Gram matrices 6.7-6.9, 0.1 s of its own), then per state the policy's side and the
    compare; 0.2 s between the parts is the reading's own (its dict, the clock)."""
    spans = [
        _span("probe request", 0, 10, "probe"), _span("probe", 0, 6, "probe"),
        _span("fixed-state reading", 6, 10, "probe"), _span("reading: BF16 side", 6, 7, "probe"),
        _span("reading: BF16 run", 6, 6.5, "probe"), _span("reading: BF16 gradients", 6.5, 6.7, "probe"),
        _span("reading: BF16 grams", 6.7, 6.9, "probe"),
        _span("reading: side", 7, 8, "probe"), _span("reading: compare", 8, 8.8, "probe"),
        _span("reading: side", 8.8, 9.4, "probe"), _span("reading: compare", 9.4, 9.8, "probe"),
    ]
    parts = probe_time(spans, 0.0, 10.0)
    assert parts == pytest.approx({"busy: probe": 6.0, "busy: reading: BF16 run": 0.5,
                                   "busy: reading: BF16 gradients": 0.2, "busy: reading: BF16 grams": 0.2,
                                   "busy: reading: BF16 side": 0.1, "busy: reading: side": 1.6,
                                   "busy: reading: compare": 1.2, "busy: fixed-state reading": 0.2})

