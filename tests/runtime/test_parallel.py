"""Several workers on one study, through a real PostgreSQL and a real ``mlflow server`` over HTTP.

These are the set-up the README describes for several machines (workers on
one machine here): the study in PostgreSQL, MLflow runs logged to one
tracking server. ``.ci/run`` starts the PostgreSQL (tests/test_postgres.sh).
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter

import pytest
from optuna.trial import TrialState

from _cluster import MlflowServer, finish, load, postgres_ctl, postgres_url, precsearch, unique_study, wait_for
from _spaces import tiny_space_dict, write_space
from precsearch.search.front import trial_rows
from precsearch.search.duplicate_trials import is_duplicate  # a policy proposed again runs no probe, has no MLflow run
from precsearch.runtime.study import finished_count

pytestmark = pytest.mark.postgres


@pytest.fixture
def server(tmp_path):
    s = MlflowServer(tmp_path).start()
    yield s
    s.kill()


#: User attributes that say why a trial was closed without completing (precsearch.runtime._optimize).
WHY_CLOSED = ("fail_reason", "not_needed", "interrupted", "duplicate_of", "requeued_from")


def _space(tmp_path, name: str, storage: str, tracking: str, **overrides):
    data = tiny_space_dict(**{"study.name": name, "study.storage": storage, "tracking.uri": tracking,
                              "probe.steps": 6, "objectives.reference_seeds": 1, "study.heartbeat_s": 1,
                              "study.stale_after_s": 4, "study.store_retry_s": 20, **overrides})
    return write_space(tmp_path, data)


def _runs_per_trial(server: MlflowServer, experiment: str) -> Counter:
    return Counter(int(r.data.tags["trial_number"]) for r in server.trial_runs(experiment))


def test_three_workers_one_study_no_trial_lost_or_repeated(tmp_path, server):
    """3 CPU workers, 12 trials: each trial once in Optuna and once in MLflow, the front tagged as stored.

    Failed in three of six fresh-clone CI runs on 2026-12-05 with one trial FAIL and the run otherwise fine; the
    attributes shown on failure said the third was a surplus close (``not_needed``), which loses nothing."""
    url, name = postgres_url(), unique_study()
    space = _space(tmp_path, name, url, server.url, **{"study.n_trials": 12})
    start = time.monotonic()
    proc = precsearch("run", str(space), "--workers", "3", "--no-progress", "--output-dir", str(tmp_path / "out"),
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = finish(proc, 900)
    wall = time.monotonic() - start
    assert proc.returncode == 0, out[-3000:]
    study = load(name, url)
    states = Counter(t.state for t in study.trials)
    failed = [(t.number, t.state.name, {k: v for k, v in t.user_attrs.items() if k in WHY_CLOSED},
               sorted(t.user_attrs), sorted(t.system_attrs)) for t in study.trials if t.state is not TrialState.COMPLETE]
    said = [line for line in out.splitlines() if "heartbeat" in line or "fail" in line.lower()]
    # none lost (FAIL/RUNNING/WAITING); a trial closed as surplus (asked when the finished and running trials
    # already made up n_trials: FAIL with not_needed, never run, not counted) is not lost. CI showed local
    # workers reach that close (2026-12-05): the count read the study twice, and a trial finishing between
    # the reads was counted twice or not at all; it reads once now (tests/runtime/test_surplus.py)
    lost = [f for f in failed if not (f[1] == "FAIL" and "surplus" in f[2].get("not_needed", ""))]
    assert not lost, (states, failed, said[-20:])
    counted = [t for t in study.trials if "duplicate_of" not in t.user_attrs]  # a policy proposed again is free
    assert len(counted) == 12 and len({str(sorted(t.params.items())) for t in counted}) == 12
    runs = _runs_per_trial(server, name)
    assert runs == {t.number: 1 for t in counted}, runs  # one MLflow run per trial, no duplicates
    workers = {t.user_attrs["worker"]["pid"] for t in counted}
    assert len(workers) == 3, "every worker ran trials"
    front = {r["trial"] for r in trial_rows(study, study.user_attrs["objectives"]) if r["pareto"]}
    tagged = {int(r.data.tags["trial_number"]) for r in server.trial_runs(name) if r.data.tags["pareto"] == "true"}
    assert front and tagged == front
    print(f"\n3 workers, 12 trials, wall {wall:.1f} s, duplicates 0, lost 0")


def test_sigkilled_worker_trial_is_failed_by_heartbeat_and_retried(tmp_path, server):
    """A worker killed mid-trial: another worker fails its trial after the grace period and runs it again."""
    url, name = postgres_url(), unique_study()
    space = _space(tmp_path, name, url, server.url, **{"study.n_trials": 5, "probe.steps": 40})
    assert precsearch("run", str(space), "--n-trials", "1", "--no-progress", "--output-dir", str(tmp_path / "o"),
                      stdout=subprocess.DEVNULL).wait(timeout=600) == 0
    env = {"PRECSEARCH_STORAGE": url, "MLFLOW_TRACKING_URI": server.url}
    args = ("worker", "--study", name, "--no-progress")
    victim = precsearch(*args, "--name", "victim", "--output-dir", str(tmp_path / "a"), env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def victim_running():  # mid-trial: its MLflow run recorded on the trial, so the heartbeat path can fail it
        return [t for t in load(name, url).trials
                if t.state is TrialState.RUNNING and t.user_attrs.get("worker", {}).get("pid") == victim.pid
                and "mlflow_run_id" in t.user_attrs]

    wait_for(lambda: victim_running(), 300, "the victim worker to start a trial")
    killed = victim_running()[0].number
    victim.kill()
    victim.wait()
    survivor = precsearch(*args, "--name", "survivor", "--output-dir", str(tmp_path / "b"), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = finish(survivor, 900)
    assert survivor.returncode == 0, out[-3000:]
    study = load(name, url)
    assert finished_count(study) == 5
    lost = next(t for t in study.trials if t.number == killed)
    assert lost.state is TrialState.FAIL and "fail_reason" not in lost.user_attrs
    retry = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed]
    assert len(retry) == 1 and retry[0].state is TrialState.COMPLETE and retry[0].params == lost.params
    assert "no heartbeat" in out
    run = next(r for r in server.trial_runs(name) if r.data.tags["trial_number"] == str(killed))
    assert run.info.status == "FAILED" and "no heartbeat" in run.data.tags["fail_reason"]
    assert _runs_per_trial(server, name) == {t.number: 1 for t in study.trials
                                             if t.state is not TrialState.WAITING and not is_duplicate(t)}


def test_unreachable_postgres_is_a_clear_error_within_seconds(tmp_path, server):
    url = "postgresql://precsearch:s3cret-pw@127.0.0.1:9/precsearch"  # port 9 (discard): nothing listens
    space = _space(tmp_path, unique_study(), url, server.url)
    start = time.monotonic()
    proc = precsearch("run", str(space), "--no-progress", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert time.monotonic() - start < 30  # interpreter start-up included
    assert "study.storage" in err and "cannot open Optuna storage" in err and "Traceback" not in err
    assert "s3cret-pw" not in out + err


def test_mlflow_server_lost_mid_study_is_retried_and_nothing_logged_twice(tmp_path, server):
    """The tracking server dies for a few seconds mid-study: the workers wait, then finish; one run per trial."""
    url, name = postgres_url(), unique_study()
    space = _space(tmp_path, name, url, server.url, **{"study.n_trials": 4, "probe.steps": 20,
                                                       "study.store_retry_s": 120})
    proc = precsearch("run", str(space), "--no-progress", "--output-dir", str(tmp_path / "out"),
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for(lambda: finished_count(load(name, url)) >= 1, 300, "a first finished trial")
    server.kill()
    time.sleep(4)
    server.start()
    out = finish(proc, 900)
    assert proc.returncode == 0, out[-3000:]
    study = load(name, url)
    assert finished_count(study) == 4
    assert _runs_per_trial(server, name) == {t.number: 1 for t in study.trials if not is_duplicate(t)}


def test_mlflow_server_gone_for_good_stops_with_a_clear_error_then_resumes(tmp_path, server):
    url, name = postgres_url(), unique_study()
    space = _space(tmp_path, name, url, server.url, **{"study.n_trials": 4, "probe.steps": 20,
                                                       "study.store_retry_s": 3})
    cmd = ("run", str(space), "--no-progress", "--output-dir", str(tmp_path / "out"))
    proc = precsearch(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: finished_count(load(name, url)) >= 1, 300, "a first finished trial")
    server.kill()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    assert "failed" in err and "over 3 s" in err and "re-run" in err and "Traceback" not in err
    done_before = {t.number: t.datetime_complete for t in load(name, url).trials if t.state is TrialState.COMPLETE}
    server.start()
    again = precsearch(*cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = finish(again, 900)
    assert again.returncode == 0, out[-3000:]
    study = load(name, url)
    assert finished_count(study) == 4
    kept = {t.number: t.datetime_complete for t in study.trials if t.number in done_before}
    assert kept == done_before  # finished trials were not run again
    runs = _runs_per_trial(server, name)
    # one run per trial that ran; a duplicate (the sampler proposed finished params again: told their values,
    # never probed) has none, as in the test above. Whether one repeats depends on timing (2 of 6 runs here, 2026-12-02).
    complete = [t for t in study.trials if t.state is TrialState.COMPLETE]
    assert all(runs[t.number] == (0 if is_duplicate(t) else 1) for t in complete), runs


def test_postgres_lost_mid_study_is_retried_and_the_study_completes(tmp_path, server):
    """PostgreSQL stops for a few seconds mid-study: storage calls wait and retry; nothing recorded twice."""
    url, name = postgres_url(), unique_study()
    space = _space(tmp_path, name, url, server.url, **{"study.n_trials": 4, "probe.steps": 20,
                                                       "study.store_retry_s": 120, "study.stale_after_s": 30})
    proc = precsearch("run", str(space), "--no-progress", "--output-dir", str(tmp_path / "out"),
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: finished_count(load(name, url)) >= 1, 300, "a first finished trial")
        postgres_ctl("stop")
        time.sleep(5)
    finally:
        postgres_ctl("start")
    out = finish(proc, 900)
    assert proc.returncode == 0, out[-3000:]
    assert "retrying" in out  # it did meet the outage
    study = load(name, url)
    assert finished_count(study) == 4
    assert Counter(t.state for t in study.trials if not is_duplicate(t))[TrialState.COMPLETE] == 4
    assert _runs_per_trial(server, name) == {t.number: 1 for t in study.trials if not is_duplicate(t)}


def test_rungs_over_postgres_two_separate_workers_promote_each_policy_once(tmp_path, server):
    """Fidelity rungs on PostgreSQL with two `precsearch worker`s in their own output directories (as on two
    machines): each promotion runs once, at its rung; a worker without the source's checkpoint runs the
    rung from step 0, and its result is the same run (the first rung's losses repeated)."""
    url, name = postgres_url(), unique_study()
    space = _space(tmp_path, name, url, server.url, **{"study.n_trials": 4, "probe.steps": 12,
                                                       "study.fidelity": {"rungs": [12, 24], "promote": 2}})
    assert precsearch("run", str(space), "--n-trials", "1", "--no-progress", "--output-dir", str(tmp_path / "o"),
                      stdout=subprocess.DEVNULL).wait(timeout=600) == 0
    env = {"PRECSEARCH_STORAGE": url, "MLFLOW_TRACKING_URI": server.url}
    workers = [precsearch("worker", "--study", name, "--no-progress", "--name", f"w{i}", "--output-dir",
                          str(tmp_path / f"w{i}"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for i in range(2)]
    for w in workers:
        out = finish(w, 900)
        assert w.returncode == 0, out[-3000:]
    study = load(name, url)
    # a policy both workers proposed at once is told its twin's values (COMPLETE, uncounted): not a run
    complete = [t for t in study.trials if t.state is TrialState.COMPLETE and not is_duplicate(t)]
    table = [(t.number, t.state.name, t.user_attrs.get("fidelity_steps"), t.user_attrs.get("promoted_from"),
              t.user_attrs.get("not_needed"), t.user_attrs.get("duplicate_of"),
              t.user_attrs.get("worker", {}).get("pid"), t.params) for t in study.trials]
    assert Counter(t.user_attrs["fidelity_steps"] for t in complete) == {12: 4, 24: 2}, table
    promoted = [t for t in complete if "promoted_from" in t.user_attrs]
    assert len({t.user_attrs["promoted_from"] for t in promoted}) == 2
    by_number = {t.number: t for t in study.trials}
    for t in promoted:
        source = by_number[t.user_attrs["promoted_from"]].user_attrs["probe_result"]["losses"]
        assert t.user_attrs["probe_result"]["losses"][:12] == source
    assert not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert _runs_per_trial(server, name) == {t.number: 1 for t in complete}
