"""Seeded batches of proposals (``precsearch.search.proposals``): the same study whatever finishes first.

Workers are simulated in one process on one shared storage, each with a study object of its own whose
sampler is seeded apart (as ``precsearch worker`` seeds them): a scheduler drawn from a seed picks which
worker acts next, so the trials finish in another order for every schedule seed. The objective is a fake,
a deterministic function of the params, standing for seeded probes. What would be wrong if these failed:
which worker finished first would change what the study proposes, so the same command would give
another front (issue 53: three runs of the quickstart, three first trials, two fronts).
"""

from __future__ import annotations

import random
import zlib

import optuna
import pytest
from optuna.trial import TrialState

from precsearch.config.loader import load_space
from precsearch.runtime._optimize import _requeue
from precsearch.search import proposals
from precsearch.search.sampling import suggest_policy
from _spaces import SMOKE

optuna.logging.set_verbosity(optuna.logging.WARNING)

QUICKSTART = SMOKE.parent / "quickstart.yaml"
DIRECTIONS = ["maximize", "minimize"]


@pytest.fixture(scope="module")
def space():
    return load_space(QUICKSTART)  # TPE over 9 searched knobs, 12 trials: the sampler's model is used


def _score(params: dict) -> tuple[list[float], float]:
    """A fake probe: values and the stability constraint, fixed by the params alone."""
    text = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    memory = sum(str(v).startswith("fp8") for v in params.values()) / 4
    instability = (zlib.crc32(text.encode()) % 1000) / 1e5
    return [memory, instability], instability - 0.005


def _run(space, schedule_seed: int, workers: int, interrupt_at: int | None = None, n_trials: int = 12,
         studies_out: list | None = None) -> list[tuple]:
    """Run ``n_trials`` with ``workers`` simulated workers; the scored trials as (batch, slot, params,
    values), in the order they were proposed."""
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="s", directions=DIRECTIONS)
    studies = [optuna.load_study(study_name="s", storage=storage,
                                 sampler=optuna.samplers.RandomSampler(seed=1000 + 7919 * w)) for w in range(workers)]
    proposals.set_batch_size(studies[0], workers)
    pick, held, told = random.Random(schedule_seed), [None] * workers, 0
    while len(studies[0].get_trials(states=(TrialState.COMPLETE,))) < n_trials:
        w = pick.randrange(workers)
        study = studies[w]
        if held[w] is None:
            if proposals.queue_next(study, space.study, lambda t: suggest_policy(space, t), n_trials):
                held[w] = study.ask()
                suggest_policy(space, held[w])
            continue
        trial, held[w] = held[w], None
        if told == interrupt_at:  # stopped mid-probe: failed, its params queued again (the run's Ctrl-C path)
            study.tell(trial, state=TrialState.FAIL)
            _requeue(study, study._storage.get_trial(trial._trial_id))
        else:
            values, constraint = _score(trial.params)
            trial.set_constraint("stability", constraint)
            study.tell(trial, values)
        told += 1
    if studies_out is not None:
        studies_out.append(studies[0])
    done = [t for t in studies[0].get_trials() if t.state is TrialState.COMPLETE]
    return sorted((t.user_attrs[proposals.PROPOSAL]["batch"], t.user_attrs[proposals.PROPOSAL]["slot"],
                   tuple(sorted(t.params.items())), tuple(t.values)) for t in done)


def test_two_workers_propose_the_same_trials_whichever_finishes_first(space):
    runs = [_run(space, seed, workers=2) for seed in range(4)]
    assert all(run == runs[0] for run in runs[1:])
    assert len(runs[0]) == space.study.n_trials
    assert len({params for _, _, params, _ in runs[0]}) > 1


def test_one_worker_proposes_what_two_do(space):
    # batches of max(2, workers): the default command and --workers 2 give one study
    assert _run(space, 0, workers=1) == _run(space, 3, workers=2)


def test_an_interrupted_trial_queued_again_leaves_the_study_as_it_would_have_been(space):
    # the Ctrl-C path: the trial fails, its params are queued again with their place in the batch
    assert _run(space, 1, workers=2, interrupt_at=3) == _run(space, 2, workers=2)


def test_a_study_ends_with_nothing_queued_and_its_trials_begin_a_longer_ones(space):
    # the last batch proposes only what the study still needs: its first proposals, those of a whole batch
    kept = []
    five = _run(space, 0, workers=2, n_trials=5, studies_out=kept)
    assert not kept[0].get_trials(states=(TrialState.WAITING, TrialState.RUNNING))
    assert five == _run(space, 1, workers=2, n_trials=6)[:5]


def test_batch_seeds_differ_by_batch_and_by_study_seed():
    seeds = {proposals.batch_seed(s, b) for s in (0, 1, 2**32 - 1) for b in range(50)}
    assert len(seeds) == 150 and all(0 <= s < 2**32 for s in seeds)


def test_control_workers_sampling_at_their_own_asks_give_other_trials_per_schedule(space):
    """Without the batches (each worker's seeded sampler asked when it is free), the schedule changes the
    trials: the test above would catch a change that let timing back into the proposals."""
    def naive(schedule_seed: int) -> list:
        storage = optuna.storages.InMemoryStorage()
        optuna.create_study(storage=storage, study_name="s", directions=DIRECTIONS)
        studies = [optuna.load_study(study_name="s", storage=storage,
                                     sampler=proposals.make_sampler(space.study, w)) for w in range(2)]
        pick, held = random.Random(schedule_seed), [None, None]
        while len(studies[0].get_trials(states=(TrialState.COMPLETE,))) < space.study.n_trials:
            w = pick.randrange(2)
            if held[w] is None:
                held[w] = studies[w].ask()
                suggest_policy(space, held[w])
            else:
                trial, held[w] = held[w], None
                values, constraint = _score(trial.params)
                trial.set_constraint("stability", constraint)
                studies[w].tell(trial, values)
        return [tuple(sorted(t.params.items())) for t in studies[0].get_trials()]

    assert len({tuple(naive(seed)) for seed in range(4)}) > 1
