"""Workers on other machines ask past ``n_trials`` at once: the later askers stand down (``_optimize._surplus``).

Workers of one output directory count and ask under one file lock; workers with their own
directories (other machines) cannot share it, so two can each count 3 of 4 finished trials
and both ask. These tests build that state in a study directly: the trial asked later sees
the earlier one running and is closed uncounted; the earlier one runs.
"""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.trial import TrialState

from precsearch.runtime._optimize import _surplus
from precsearch.search.summary import finished_count

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _ctx(study: optuna.Study) -> SimpleNamespace:
    return SimpleNamespace(study=study, space=SimpleNamespace(study=SimpleNamespace(store_retry_s=5)))


def _study_with_finished(n: int) -> optuna.Study:
    study = optuna.create_study(directions=["minimize"])
    for i in range(n):
        study.add_trial(optuna.trial.create_trial(params={"x": i}, distributions={
            "x": optuna.distributions.IntDistribution(0, 100)}, values=[float(i)]))
    return study


def test_the_later_of_two_racing_asks_stands_down():
    study = _study_with_finished(3)
    first, second = study.ask(), study.ask()  # two machines, each having counted 3 of 4
    ctx = _ctx(study)
    assert not _surplus(ctx, first, target=4), "the first asker's trial is needed: it makes the fourth"
    assert _surplus(ctx, second, target=4)
    closed = study._storage.get_trial(second._trial_id)
    assert closed.state is TrialState.FAIL and closed.user_attrs["not_needed"].startswith("surplus")
    assert finished_count(study) == 3, "a surplus trial is not counted"
    assert study._storage.get_trial(first._trial_id).state is TrialState.RUNNING


def test_below_the_target_both_run():
    study = _study_with_finished(2)
    first, second = study.ask(), study.ask()
    ctx = _ctx(study)
    assert not _surplus(ctx, first, target=4) and not _surplus(ctx, second, target=4)


def test_a_queued_policy_taken_as_surplus_stays_queued():
    """Params queued to run again (a dead worker's trial) are not dropped by standing down."""
    study = _study_with_finished(3)
    running = study.ask()
    study.enqueue_trial({"x": 42})
    queued = study.ask()  # takes the queued params
    assert _surplus(_ctx(study), queued, target=4)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs.get("fixed_params") for t in waiting] == [{"x": 42}]
    assert study._storage.get_trial(running._trial_id).state is TrialState.RUNNING


class _FinishesBetweenReads:
    """A study whose running trial ``trial`` is told COMPLETE right after the first read of the trials: what a
    worker beside the counting one does at the wrong moment."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial):
        self._study, self._trial, self.reads = study, trial, 0

    def get_trials(self, *args, **kwargs):
        out = self._study.get_trials(*args, **kwargs)
        self.reads += 1
        if self.reads == 1:
            self._study.tell(self._trial, [1.0])
        return out

    def __getattr__(self, name):
        return getattr(self._study, name)


def test_a_trial_finishing_while_the_study_is_counted_is_counted_once():
    """Counted in two reads (running, then finished), a trial that finished between them was counted twice,
    and a local worker's needed trial was closed as surplus (CI, three workers, 2026-12-05); counted the other
    way round it was missed and one trial too many was asked. One read counts it once either way."""
    study = _study_with_finished(2)
    finishing, needed = study.ask(), study.ask()  # 2 finished + 1 running elsewhere: ``needed`` makes the fourth
    racing = _FinishesBetweenReads(study, finishing)
    assert not _surplus(_ctx(racing), needed, target=4)
    assert study._storage.get_trial(needed._trial_id).state is TrialState.RUNNING
