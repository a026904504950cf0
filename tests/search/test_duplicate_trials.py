"""A policy proposed again is not paid as a trial (issue 16): told at once, not counted, not logged."""

from __future__ import annotations

from pathlib import Path

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.search.front import trial_rows
from precsearch.runtime.study import finished_count
from precsearch.runtime.workspace import Workspace

QUICK = {"probe.steps": 6, "objectives.reference_seeds": 1, "study.sampler": "random"}


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}")


def _distinct(study: optuna.Study) -> set[str]:
    return {str(sorted(t.params.items())) for t in study.trials if t.state is TrialState.COMPLETE}


def _trial_runs(out: Path) -> list:
    ws = Workspace.load(out)
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name(ws.experiment)
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("precsearch.role") == "trial"]


def test_duplicates_do_not_count_and_a_resume_with_more_trials_gets_new_policies(tmp_path, capsys):
    """cpu_smoke's random sampler at seed 8 proposes its first policy again as its fourth (batch 1's second)."""
    space = write_space(tmp_path, tiny_space_dict(**QUICK | {"study.n_trials": 4, "study.seed": 8}))
    out = tmp_path / "out"
    assert main(["run", str(space), "--output-dir", str(out), "--no-progress"]) == 0
    study = _study(out)
    duplicates = [t for t in study.trials if "duplicate_of" in t.user_attrs]
    assert duplicates, "the seed must give a duplicate, or this test tests nothing"
    for t in duplicates:
        twin = next(s for s in study.trials if s.number == t.user_attrs["duplicate_of"])
        assert t.params == twin.params and t.values == twin.values and "duplicate_of" not in twin.user_attrs
    # a duplicate has no run and no row: without its line it would vanish from what the user reads
    printed = capsys.readouterr().out
    for t in duplicates:
        assert f"trial {t.number}: the same policy as trial {t.user_attrs['duplicate_of']}, already scored" in printed
    assert finished_count(study) == len(_distinct(study)) == 4
    assert len(_trial_runs(out)) == 4  # no MLflow run for a duplicate
    assert len(trial_rows(study, study.user_attrs["objectives"])) == 4  # nor a row in the front

    assert main(["run", str(space), "--output-dir", str(out), "--no-progress", "--n-trials", "6"]) == 0
    study = _study(out)
    assert finished_count(study) == len(_distinct(study)) == 6


def test_an_exhausted_space_stops_with_every_distinct_policy(tmp_path, capsys):
    space = write_space(tmp_path, tiny_space_dict(**QUICK | {
        "study.n_trials": 4, "search.groups": [{"name": "mlp", "modules": ["*.mlp.*"],
                                                 "precision": {"choices": ["bf16", "fp8_block"]}}],
        "search.warmup_steps": 0}))
    out = tmp_path / "out"
    assert main(["run", str(space), "--output-dir", str(out), "--no-progress"]) == 0
    assert "looks exhausted; stopping with 2 distinct policies" in capsys.readouterr().out
    study = _study(out)
    assert finished_count(study) == len(_distinct(study)) == 2
    assert not [t for t in study.trials if t.state is TrialState.RUNNING]


def test_a_proposal_equal_to_a_policy_another_worker_runs_waits_for_it_and_takes_its_values():
    """Seen with three workers on PostgreSQL: two workers asked for the same policy at once and both
    ran and counted it (12 trials, 10 policies). The later one now waits for the running twin and
    takes its result; a twin that fails leaves it to run itself; the earlier of two never waits."""
    import threading

    from precsearch.search.duplicate_trials import await_twin

    study = optuna.create_study(directions=["maximize", "minimize"])
    dist = {"p": optuna.distributions.CategoricalDistribution(["a", "b"])}
    for p in ("a", "a", "b", "b"):
        study.enqueue_trial({"p": p})
    a1, a2, b1, b2 = (study.ask(dist) for _ in range(4))
    assert await_twin(study, a1, 10, 0.01, lambda: False) is None  # the lower number does not wait

    def finish():
        a1.set_user_attr("score", {"feasible": True})
        study.tell(a1, [0.1, 0.0])

    threading.Timer(0.3, finish).start()
    twin = await_twin(study, a2, 10, 0.01, lambda: False)
    assert twin is not None and twin.number == a1.number

    threading.Timer(0.3, lambda: study.tell(b1, state=TrialState.FAIL)).start()
    assert await_twin(study, b2, 10, 0.01, lambda: False) is None  # the twin failed: b2 runs itself
    assert study.trials[b1.number].state is TrialState.FAIL


def test_a_twin_finishing_while_the_waiter_reads_the_study_is_still_taken():
    """Three workers on PostgreSQL (CI): 12 counted trials, 11 policies. The waiter read the finished trials,
    then the twin finished, then it read the running ones: the twin was in neither, and the waiter ran the
    policy again. Here the twin finishes just before the waiter's read of the running trials."""
    from precsearch.search.duplicate_trials import await_twin

    study = optuna.create_study(directions=["maximize", "minimize"])
    dist = {"p": optuna.distributions.CategoricalDistribution(["a"])}
    for _ in range(2):
        study.enqueue_trial({"p": "a"})
    first, waiter = study.ask(dist), study.ask(dist)
    read = study.get_trials

    def get_trials(*args, states=None, **kwargs):
        if states == (TrialState.RUNNING,) and study.trials[first.number].state is TrialState.RUNNING:
            first.set_user_attr("score", {"feasible": True})
            study.tell(first, [0.1, 0.0])  # the other worker tells its trial at this very moment
        return read(*args, states=states, **kwargs)

    study.get_trials = get_trials
    twin = await_twin(study, waiter, 10, 0.01, lambda: False)
    assert twin is not None and twin.number == first.number


def test_a_worker_waiting_on_a_twin_checks_heartbeats_else_a_dead_twin_is_waited_on_for_ever():
    """CI: a killed worker's trial, and a survivor that proposed the same params, waited on it 15 min: the
    survivor checked heartbeats only between trials. The wait runs the check; here the second check fails
    the twin (as Optuna's stale-trial check would), and the waiter then runs the policy itself."""
    from precsearch.search.duplicate_trials import await_twin

    study = optuna.create_study(directions=["maximize", "minimize"])
    dist = {"p": optuna.distributions.CategoricalDistribution(["a"])}
    for _ in range(2):
        study.enqueue_trial({"p": "a"})
    dead, waiter = study.ask(dist), study.ask(dist)
    checks = []

    def check():
        checks.append(1)
        if len(checks) == 2:
            study.tell(dead, state=TrialState.FAIL)

    assert await_twin(study, waiter, 10, 0.01, lambda: False, check) is None
    assert len(checks) == 2 and study.trials[dead.number].state is TrialState.FAIL
