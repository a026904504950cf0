"""The terminal's study status line, the BF16 reference notice and the next commands after a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from precsearch.cli import main, next_commands
from precsearch.runtime.progress import Eta, compile_notice, duration, reference_notice, status_line
from precsearch.search.summary import study_metrics


def test_status_line_counts_and_eta():
    line = status_line("qs", 12, 4, 3, 2, 120.0, 240.0, running=4)
    assert line == "study qs: trial 4 running; 4 of 12 trials finished, 3 feasible, front 2 | elapsed 2m00s, ETA 4m00s"
    assert status_line("qs", 12, 0, 0, 0, 5.0, None).endswith("ETA after the first probe")
    assert status_line("qs", 12, 12, 5, 3, 3700.0, 0.0).endswith("elapsed 1h01m, done")
    assert duration(59.4) == "59s" and duration(61) == "1m01s"


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _quickstart(eta: Eta, clock: _Clock, trial_s_per_step) -> list[tuple[int, float | None, float]]:
    """The quickstart's shape: 12 trials of 60 steps, 3 BF16 seeds per clipping value (2 values: trials 0
    and 1 each run theirs first) at 1 s/step, 3 s per trial outside probes. Returns (trial, ETA, start)."""
    seen = []
    for trial in range(12):
        if trial < 2:
            for _ in range(3):
                clock.now += 60.0
                eta.probe_done("reference", 60, 60.0)
        seconds = 60 * trial_s_per_step(trial)
        clock.now += seconds
        eta.probe_done("trial", 60, seconds)
        clock.now += 3.0
        eta.trial_done()
        seen.append((trial, eta.left_s(11 - trial), clock.now))
    return seen


def test_eta_counts_the_references_still_to_run_and_holds_within_30_percent_from_trial_2():
    """A mean time per trial counts the six reference probes as trial time: the quickstart's ETA swung
    from 49 min to 1 h 17 min for 27 min left. Each probe kind timed apart must stay close to the truth,
    with trial step times that vary +-25%."""
    import random

    rng = random.Random(0)
    times = [1.5 * rng.uniform(0.75, 1.25) for _ in range(12)]
    clock = _Clock()
    eta = Eta(trial_steps=60, reference_steps=6 * 60, clock=clock)
    seen = _quickstart(eta, clock, lambda t: times[t])
    end = seen[-1][2]
    for trial, estimate, at in seen[2:-1]:
        real = end - at
        assert abs(estimate - real) <= 0.3 * real, (trial, estimate, real)
    # the estimate of the old kind (elapsed / trials finished x trials left) misses by more than 2x here
    trial0, _, at0 = seen[0]
    naive = (at0 - 1000.0) / 1 * 11
    assert naive > 2 * (end - at0)
    # and ours, after trial 0, counts the second clipping value's 3 references still to run
    assert abs(seen[0][1] - (end - at0)) <= 0.3 * (end - at0)


def test_eta_shares_the_work_left_among_the_workers_on_the_study():
    """Two workers on 12 trials, each taking 63 s a trial, the other worker half way through its trial whenever
    this one finishes one: the study has (left - 0.5) trials of work for 2 workers. One worker's own rate times
    every trial left (what each showed before) is about twice that."""
    clock = _Clock()
    eta = Eta(trial_steps=60, clock=clock)
    for k in range(1, 6):  # this worker's k-th trial; the other worker finished as many meanwhile
        clock.now += 63.0
        eta.probe_done("trial", 60, 60.0)
        eta.trial_done()
        left = 12 - 2 * k + 1  # the other worker's current trial is not finished yet
        real = (left - 0.5) * 63.0 / 2
        assert eta.left_s(left, parallel=2) == pytest.approx(real)
        assert eta.left_s(left) > 1.8 * real
    assert eta.left_s(1, parallel=2) == pytest.approx(31.5)  # the last trial: the other worker's, half done


def test_eta_before_any_probe_is_unknown_and_a_reference_uses_up_its_steps():
    """An ETA shown before anything was timed would be invented; one that kept counting references run
    already would stay high until the end."""
    clock = _Clock()
    eta = Eta(trial_steps=10, reference_steps=20, clock=clock)
    assert eta.left_s(5) is None
    clock.now += 20.0
    eta.probe_done("reference", 10, 20.0)
    assert eta.reference_steps == 10
    # no trial timed yet: trials are estimated at the reference's 2 s/step; 10 reference steps left
    assert eta.left_s(5) == 5 * 10 * 2.0 + 10 * 2.0
    assert eta.left_s(0) == 0.0


def test_reference_notice_says_why():
    text = reference_notice(1.0, 3, 60, stress=False)
    assert "clip_grad=1.0" in text and "3 seed(s) x 60 steps" in text and "noise floor" in text
    assert "stress" in reference_notice(None, 1, 60, stress=True)


def test_next_commands_name_front_ui_and_export():
    text = next_commands(Path("/tmp/some dir"))
    assert "precsearch front --all --output-dir '/tmp/some dir'" in text
    assert "precsearch ui --output-dir '/tmp/some dir'" in text
    # the policy goes under the study's directory, not into the current one (untracked in a clone)
    assert "precsearch export --output-dir '/tmp/some dir' --pick max-memory -o '/tmp/some dir/policy.yaml'" in text


def test_without_a_feasible_trial_next_offers_a_trial_by_number_not_a_pick():
    """--pick refuses a study without a feasible trial ("no feasible finished trial among 8 to pick from"): the
    line a user copies must not be one that fails."""
    text = next_commands(Path("/tmp/s"), feasible=False, nearest={"trial": 6})
    assert "--pick" not in text and "precsearch export --output-dir /tmp/s --trial 6 -o /tmp/s/policy.yaml" in text
    assert "no trial is feasible" in text
    assert "--trial N -o" in next_commands(Path("/tmp/s"), feasible=False)  # no trial carries a reading


def _row(trial, memory, instability, feasible=True, pareto=False):
    return {"trial": trial, "memory_saved": memory, "instability": instability, "tokens_per_s": 10.0,
            "feasible": feasible, "pareto": pareto}


def test_study_metrics():
    rows = [_row(0, 0.05, 0.5, pareto=True), _row(1, 0.10, 0.75, pareto=True), _row(2, 0.2, 2.0, feasible=False)]
    m = study_metrics(rows, finished=4, objectives=["memory_saved", "instability"])
    assert m["trials_finished"] == 4 and m["trials_scored"] == 3 and m["trials_feasible"] == 2
    assert m["front_size"] == 2 and m["best_memory_saved"] == 0.10
    # reference (0 saved, instability 1.0): 0.05 x 0.5 + (0.10 - 0.05) x 0.25
    assert abs(m["hypervolume"] - (0.025 + 0.0125)) < 1e-12
    assert "best_memory_saved" not in study_metrics([rows[2]], 1, ["memory_saved", "instability"])


def test_ui_optuna_without_the_dashboard_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    import importlib.util

    from precsearch.runtime.workspace import Workspace

    Workspace(tmp_path, "s", f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db", "s").save()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna_dashboard"
                        else real(name, *a))
    assert main(["ui", "--optuna", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optuna-dashboard" in err[0] and "--optuna" in err[0]


def test_ui_optuna_serves_the_study_storage(tmp_path, capsys, monkeypatch):
    import sys
    import types

    from precsearch.runtime.workspace import Workspace

    ws = Workspace(tmp_path, "s", f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db", "s")
    ws.save()
    served = {}
    fake = types.ModuleType("optuna_dashboard")
    fake.__spec__ = types.SimpleNamespace(name="optuna_dashboard")
    fake.run_server = lambda storage, host, port: served.update(storage=storage, host=host, port=port)
    monkeypatch.setitem(sys.modules, "optuna_dashboard", fake)
    assert main(["ui", "--optuna", "--output-dir", str(tmp_path), "--port", "5099"]) == 0
    assert served == {"storage": ws.storage_url, "host": "127.0.0.1", "port": 5099}


def test_the_workers_an_eta_is_shared_by_are_the_running_and_the_recently_finished():
    """Another worker counts while it runs a trial, or finished one within two of this worker's trial times
    (two workers that finish at one moment each see the other idle); a worker gone for longer, or this one,
    does not."""
    import datetime
    from types import SimpleNamespace

    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import FrozenTrial, TrialState

    from precsearch.runtime._tell import _workers_on

    study = optuna.create_study(directions=["maximize", "minimize"])
    now = datetime.datetime.now()

    def add(worker: int, state: TrialState, finished_ago_s: float | None) -> None:
        done = None if finished_ago_s is None else now - datetime.timedelta(seconds=finished_ago_s)
        study.add_trial(FrozenTrial(
            number=0, state=state, value=None, values=[0.0, 0.0] if state is TrialState.COMPLETE else None,
            datetime_start=now - datetime.timedelta(seconds=900), datetime_complete=done,
            params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
            user_attrs={"worker": {"host": "h", "pid": worker}}, system_attrs={}, intermediate_values={},
            trial_id=0))

    add(1, TrialState.RUNNING, None)  # running now
    add(2, TrialState.COMPLETE, 5.0)  # finished a moment ago
    add(3, TrialState.COMPLETE, 600.0)  # gone ten minutes ago
    add(9, TrialState.RUNNING, None)  # this worker
    ctx = SimpleNamespace(study=study, worker=SimpleNamespace(to_dict=lambda: {"host": "h", "pid": 9}),
                          status=SimpleNamespace(seconds_per_trial=lambda: 30.0))
    assert _workers_on(ctx) == 3  # this one, 1 and 2


def test_time_waiting_on_another_workers_references_is_not_trial_time():
    """A worker that waited 120 s for the references another worker ran, then ran a 60 s trial: its trials
    cost 60 s, not 180 s (its ETA read 3m25s for 1m50s left before)."""
    clock = _Clock()
    eta = Eta(trial_steps=60, clock=clock)
    clock.now += 120.0
    eta.waited(120.0)
    clock.now += 60.0
    eta.probe_done("trial", 60, 60.0)
    eta.trial_done()
    assert eta.left_s(4) == pytest.approx(4 * 60.0)


def test_a_readings_bf16_side_is_not_trial_time_and_the_sides_still_to_make_are_counted():
    """The 8B space on an H100 (2026-12-05): 16 trials of 40 steps, 2 clipping values, one BF16 reference each
    (6 s), a trial 7 s of probe and 3 s of reading, and at the first trial of each clipping value (0 and 4) a
    20 s BF16 side. Counted as trial time, the first side made the estimate 5x the time left. Timed apart (as
    ``_probe`` does with the reading's ``bf16_side_s``), and the second side counted ahead, every estimate
    from the first trial on is within 30% of the time left."""
    clock = _Clock()
    eta = Eta(trial_steps=40, reference_steps=2 * 40, clock=clock, bf16_side_steps=2 * 40)
    seen = []
    for trial in range(16):
        if trial in (0, 4):
            _ran(eta, clock, "reference", 6.0)
            _ran(eta, clock, "bf16_side", 20.0)
        _ran(eta, clock, "trial", 10.0)
        clock.now += 0.5
        eta.trial_done()
        seen.append((eta.left_s(15 - trial), clock.now))
        if trial == 0:  # the second clipping value's side is ahead: 40 steps at the first side's 0.5 s a step
            kept, eta.bf16_side_steps = eta.bf16_side_steps, 0
            assert seen[-1][0] - eta.left_s(15) == pytest.approx(20.0)
            eta.bf16_side_steps = kept
    end = seen[-1][1]
    for trial, (estimate, at) in enumerate(seen[:-1]):
        left = end - at
        assert abs(estimate - left) <= 0.3 * left, (trial, estimate, left)
    assert eta.bf16_side_steps == 0 and eta.reference_steps == 0

    before = _Clock()  # the way before: the side inside the first trial's seconds
    lumped = Eta(trial_steps=40, reference_steps=2 * 40, clock=before)
    _ran(lumped, before, "reference", 6.0)
    _ran(lumped, before, "trial", 30.0)
    before.now += 0.5
    lumped.trial_done()
    assert lumped.left_s(15) > 2 * (end - seen[0][1])


def _ran(eta: Eta, clock: _Clock, kind: str, seconds: float, steps: int = 40) -> None:
    """A probe of ``kind`` that took ``seconds`` on ``clock``."""
    clock.now += seconds
    eta.probe_done(kind, steps, seconds)


def test_probe_times_a_readings_bf16_side_apart_from_the_trial(monkeypatch):
    """``_probe`` gives the ETA the seconds the reading's side runs say were a BF16 side as their own kind, and
    the rest as the trial's."""
    from types import SimpleNamespace

    from precsearch.probe.result import ProbeResult
    from precsearch.readings import READINGS
    from precsearch.runtime import _optimize

    ticks = iter([100.0, 130.0])
    monkeypatch.setattr(_optimize.time, "monotonic", lambda: next(ticks))
    done = []
    status = SimpleNamespace(tick=lambda: None,
                             eta=SimpleNamespace(probe_done=lambda kind, steps, s: done.append((kind, steps, s))))
    result = ProbeResult(losses=[1.0] * 40, damage={"bf16_side_s": 20.0})
    sides = next(r for r in READINGS.values() if r.fixed_states).side_runs([None], steps=40)
    ctx = SimpleNamespace(space=SimpleNamespace(probe=SimpleNamespace(steps=40)), progress=False, status=status,
                          executor=SimpleNamespace(run=lambda *a, **k: result), sides=sides)
    assert _optimize._probe(ctx, None, "trial 0", trial=0) is result
    assert done == [("bf16_side", 40, 20.0), ("trial", 40, 10.0)]


def test_a_torchao_study_on_a_gpu_says_why_its_first_probes_take_minutes():
    notice = compile_notice("torchao", "cuda")
    assert notice is not None and "compile" in notice and "200 s" in notice
    assert compile_notice("torchao", "auto") == notice  # auto picks the GPU where torchao can run at all
    assert compile_notice("torchao", "cpu") is None  # emulated there: eager, nothing to wait for
    assert compile_notice("te", "cuda") is None and compile_notice("emulated", "cpu") is None
