"""Seeded batches of proposals: what the sampler proposes does not depend on which worker finished first.

An Optuna sampler asked by each worker conditions on the trials finished at that moment, and with
several workers that moment depends on which probe finished first: the same command proposed other
policies from run to run. Here no worker's ask samples. When a study's queue is empty and none of its
trials still runs, the next batch of :func:`batch_size` policies is proposed at once and queued with
``study.enqueue_trial``; workers then take queued trials, whose params are all fixed.

Batch ``k`` is proposed by a fresh sampler seeded from (``study.seed``, ``k``), on a scratch in-memory
study that holds the scored trials in the order they were proposed; the batch's earlier proposals stay
asked and untold there, which TPE's ``constant_liar`` keeps the next one away from. So batch ``k`` depends on the seed, the
batch size and the results of the batches before it, never on timing: probes that give the same
results give the same study. An interrupted trial is queued again with its place in its batch
(:data:`PROPOSAL`), so a resumed study proposes what an uninterrupted one would.

The batch size is ``max(2, workers)`` of the run command (:func:`set_batch_size`): one worker and
two propose the same trials; more workers propose their own, the same for the same count. The last batch
proposes only the trials the study still needs (:func:`queue_next`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from precsearch.config.space import Sampler, StudySection
from precsearch.search.optuna_adapter import is_constraint_attr
from precsearch.search.summary import finished_in

#: User attribute of a proposed trial: ``{"batch": k, "slot": i, "sampler_attrs": {...}}``, the sampler's
#: own attributes of the scratch trial (an NSGA-II generation), given back to it when it reads the history.
PROPOSAL = "proposal"
#: Study user attribute: how many policies one batch proposes.
BATCH_SIZE = "proposal_batch"
#: Proposals in a batch when the study does not say (a study made before batches).
DEFAULT_BATCH = 2


def make_sampler(study: StudySection, seed: int) -> optuna.samplers.BaseSampler:
    """The sampler ``study`` names, seeded with ``seed`` (0..2**32-1, numpy's ``RandomState`` range)."""
    if study.sampler is Sampler.TPE:  # constant_liar (Optuna's default): the batch's earlier proposals lie
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(4, study.n_trials // 3)),
                                          multivariate=True, constant_liar=True)
    if study.sampler is Sampler.NSGA2:
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, study.n_trials // 3)))
    if study.sampler is Sampler.GP:
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def batch_seed(seed: int, batch: int) -> int:
    """The seed of batch ``batch``'s sampler: apart for every (seed, batch), in 0..2**32-1."""
    return int(np.random.SeedSequence([seed, batch]).generate_state(1)[0])


def set_batch_size(study: optuna.Study, workers: int) -> int:
    """Record the batch size of a run with ``workers`` local workers (at least 2); return it."""
    size = max(DEFAULT_BATCH, workers)
    if study.user_attrs.get(BATCH_SIZE) != size:
        study.set_user_attr(BATCH_SIZE, size)
    return size


def batch_size(study: optuna.Study) -> int:
    """How many policies the study's next batch proposes."""
    return int(study.user_attrs.get(BATCH_SIZE, DEFAULT_BATCH))


def queue_next(study: optuna.Study, section: StudySection, suggest: Callable[[optuna.Trial], Any],
               target: int) -> bool:
    """True when a trial is queued for the caller to ask (queueing the next batch if one is due); False
    when the queue is empty and trials still run, whose results the next batch needs.

    ``suggest`` asks a trial for every searched param (``suggest_policy``). A batch proposes no more than the
    ``target`` finished trials still need (its first proposals, the same as a whole batch's): a finished study
    keeps no queued trial. Call it under the lock the workers of the study ask under: two callers at once
    would each queue a batch.
    """
    trials = study.get_trials(deepcopy=False)
    if any(t.state is TrialState.WAITING for t in trials):
        return True
    if any(t.state is TrialState.RUNNING for t in trials):
        return False
    batch = 1 + max((t.user_attrs[PROPOSAL]["batch"] for t in trials if PROPOSAL in t.user_attrs), default=-1)
    size = max(1, min(batch_size(study), target - finished_in(trials)))
    for slot, (params, sampler_attrs) in enumerate(propose(trials, section, study.directions, batch, size,
                                                           suggest)):
        study.enqueue_trial(params, user_attrs={PROPOSAL: {"batch": batch, "slot": slot,
                                                           "sampler_attrs": sampler_attrs}})
    return True


def propose(trials: Sequence[FrozenTrial], section: StudySection, directions: Sequence[optuna.study.StudyDirection],
            batch: int, size: int, suggest: Callable[[optuna.Trial], Any]) -> list[tuple[dict, dict]]:
    """``size`` proposals (params, the sampler's attributes) of batch ``batch``, given the study's ``trials``."""
    scratch = optuna.create_study(directions=list(directions),
                                  sampler=make_sampler(section, batch_seed(section.seed, batch)))
    scratch.add_trials(history(trials))
    out = []
    for _ in range(size):
        trial = scratch.ask()
        suggest(trial)
        attrs = scratch.get_trials(deepcopy=False)[trial.number].system_attrs
        out.append((dict(trial.params), {k: v for k, v in attrs.items() if not is_constraint_attr(k)}))
    return out


def history(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The scored trials as the samplers read them: in the order they were proposed, with their values,
    constraints and the attributes the proposing sampler gave them (not those of the study's own sampler)."""
    def order(t: FrozenTrial) -> tuple[int, int]:
        place = t.user_attrs.get(PROPOSAL)
        return (place["batch"], place["slot"]) if place else (-1, t.number)  # queued candidates came first

    out = []
    for t in sorted((t for t in trials if t.state is TrialState.COMPLETE), key=order):
        attrs = {k: v for k, v in t.system_attrs.items() if is_constraint_attr(k)}
        attrs |= t.user_attrs.get(PROPOSAL, {}).get("sampler_attrs", {})
        out.append(optuna.trial.create_trial(params=t.params, distributions=t.distributions, values=t.values,
                                             system_attrs=attrs))
    return out
