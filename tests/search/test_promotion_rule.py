"""The promotion rule and plan on constructed trials, and the ``study.fidelity`` checks (fast, no probes)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from _spaces import tiny_space_dict
from precsearch.config.checks import check_space
from precsearch.config.fidelity import FidelitySection
from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.search.promotion import FIDELITY, PROMOTED_FROM, plan, select, superseded_copy

OBJ = ["memory_saved", "instability"]
RUNGS = FidelitySection(rungs=[10, 20, 40], promote=2)


def _trial(number, memory, instability, *, feasible=True, rung=10, source=None, state=TrialState.COMPLETE,
           policy=None):
    attrs = {FIDELITY: rung, "score": {"memory_saved": memory, "instability": instability, "feasible": feasible}}
    if source is not None:
        attrs[PROMOTED_FROM] = source
    params = {"p": policy if policy is not None else number}
    t = optuna.trial.create_trial(state=TrialState.COMPLETE if state is TrialState.COMPLETE else state,
                                  params=params, distributions={"p": CategoricalDistribution(list(range(100)))},
                                  user_attrs=attrs, values=[memory, instability]
                                  if state is TrialState.COMPLETE else None)
    t.number = number
    return t


def test_the_front_is_promoted_whole_when_it_fits_then_the_next_layer_fills_the_places():
    """Front {0, 1}; with room for 3, the next layer {2, 3} gives one place: its most memory saved (3)."""
    trials = [_trial(0, 0.30, 0.001), _trial(1, 0.10, 0.0), _trial(2, 0.05, 0.0005), _trial(3, 0.20, 0.002),
              _trial(4, 0.50, 0.2, feasible=False)]
    assert [t.number for t in select(trials, 3, OBJ)] == [0, 1, 3]
    assert [t.number for t in select(trials, 2, OBJ)] == [0, 1]


def test_an_overfull_front_is_spread_evenly_along_memory_saved_ends_first():
    front = [_trial(i, 0.1 * i, 0.001 * i) for i in range(1, 8)]  # a 7-point trade-off, all on the front
    assert [t.number for t in select(front, 3, OBJ)] == [7, 4, 1]  # both ends and the middle
    assert [t.number for t in select(front, 1, OBJ)] == [7]  # room for one: the most memory saved


def test_infeasible_trials_and_second_copies_of_a_policy_are_never_promoted():
    trials = [_trial(0, 0.3, 0.0, feasible=False), _trial(1, 0.2, 0.0, policy=9), _trial(2, 0.2, 0.0, policy=9)]
    assert [t.number for t in select(trials, 4, OBJ)] == [1]


def test_plan_waits_for_a_rung_to_settle_then_promotes_once():
    done = [_trial(0, 0.3, 0.0), _trial(1, 0.1, 0.0), _trial(2, 0.2, 0.01)]
    running = _trial(3, 0.0, 0.0, state=TrialState.RUNNING)
    assert plan(done + [running], RUNGS, OBJ).action == "wait"
    first = plan(done, RUNGS, OBJ)
    assert first.action == "run" and [(t.number, r) for t, r in first.promote] == [(0, 20), (2, 20)]
    queued = [_trial(4, 0, 0, rung=20, source=0, state=TrialState.WAITING),
              _trial(5, 0, 0, rung=20, source=2, state=TrialState.WAITING)]
    assert plan(done + queued, RUNGS, OBJ).promote == []  # claimed: not queued twice


def test_plan_stops_at_a_diverged_rung_and_is_done_after_the_last():
    done = [_trial(0, 0.3, 0.0), _trial(1, 0.1, 0.0)]
    rung2 = [_trial(2, 0.3, 1.0, rung=20, source=0, feasible=False), _trial(3, 0.1, 0.0, rung=20, source=1)]
    step = plan(done + rung2, RUNGS, OBJ)
    assert [(t.number, r) for t, r in step.promote] == [(3, 40)]  # 2 diverged at 20 steps: not promoted
    assert plan(done + rung2 + [_trial(4, 0.1, 0.0, rung=40, source=3)], RUNGS, OBJ).action == "done"


def test_a_younger_copy_of_a_promotion_is_superseded_but_a_retry_of_a_failed_one_is_not():
    first = _trial(4, 0, 0, rung=20, source=0, state=TrialState.RUNNING)
    copy = _trial(5, 0, 0, rung=20, source=0, state=TrialState.WAITING)
    assert superseded_copy(copy, [first, copy]) is first
    failed = _trial(4, 0, 0, rung=20, source=0, state=TrialState.FAIL)
    assert superseded_copy(copy, [failed, copy]) is None


@pytest.mark.parametrize("fidelity, field, words", [
    ({"rungs": [12, 12, 40]}, "study.fidelity.rungs", "strictly increasing"),
    ({"rungs": [12, 6]}, "study.fidelity.rungs", "strictly increasing"),
    ({"rungs": []}, "study.fidelity.rungs", "at least 1"),
    ({"rungs": [12, 40], "promote": 0}, "study.fidelity.promote", "greater than or equal to 1"),
    ({"rungs": [12, 40], "bogus": 1}, "study.fidelity.bogus", "valid keys: rungs, promote"),
])
def test_bad_rungs_are_refused_naming_the_field(tmp_path, fidelity, field, words):
    from _spaces import write_space
    from precsearch.config.loader import load_space

    path = write_space(tmp_path, tiny_space_dict(**{"study.fidelity": fidelity}))
    with pytest.raises(UserError) as err:
        load_space(path)
    assert field in str(err.value) and words in str(err.value)


def test_the_first_rung_must_be_the_probe():
    space = Space.model_validate(tiny_space_dict(**{"study.fidelity": {"rungs": [20, 40]}}))
    with pytest.raises(UserError, match=r"study.fidelity.rungs.*equal probe.steps \(12\)"):
        check_space(space, file="space.yaml")
    check_space(Space.model_validate(tiny_space_dict(**{"study.fidelity": {"rungs": [12, 40]}})),
                file="space.yaml")


def test_checkpoints_are_spent_once_nothing_will_continue_them():
    """Infeasible: never promoted. Decided without it: spent. Continued by a completed promotion: spent.
    Chosen and still queued, or any trial of a rung that is still running: kept."""
    from precsearch.search.promotion import spent

    first = [_trial(0, 0.3, 0.0), _trial(1, 0.1, 0.0), _trial(2, 0.2, 0.01), _trial(3, 0.5, 0.3, feasible=False),
             _trial(4, 0.05, 0.02)]  # promote=2 chooses 0 and 2
    assert spent(first, RUNGS, OBJ) == {3}  # rung not decided yet: only the infeasible one goes
    queued = [_trial(5, 0, 0, rung=20, source=0, state=TrialState.WAITING),
              _trial(6, 0, 0, rung=20, source=2, state=TrialState.WAITING)]
    assert spent(first + queued, RUNGS, OBJ) == {1, 3, 4}
    running = [_trial(7, 0.0, 0.0, state=TrialState.RUNNING)]
    assert spent(first + queued + running, RUNGS, OBJ) == {3}  # the first rung is not settled
    done = [_trial(5, 0.3, 0.0, rung=20, source=0), queued[1]]
    assert spent(first + done, RUNGS, OBJ) == {0, 1, 3, 4}
