"""Fidelity rungs: which policies continue to a longer probe, and when.

Optuna cannot prune a multi-objective study, and a finished trial's values
cannot change, so promotion is precsearch's own scheme, kept in the study's
storage so that it survives resume, several workers and PostgreSQL:

* Every policy first runs as an ordinary trial at the first rung
  (``probe.steps``). Its user attr ``fidelity_steps`` says so.
* **A rung is decided once it has settled**: the study has its ``n_trials``
  first-rung trials finished and none running (for later rungs: no promoted
  trial of that rung running or queued). Then the rung's feasible trials are
  ranked and at most ``study.fidelity.promote`` continue (:func:`select`).
* **A promoted evaluation is a new trial**, queued with the same params and
  user attrs ``fidelity_steps`` (the next rung) and ``promoted_from`` (the
  trial of the previous rung, whose checkpoint it continues). Whoever settles a
  rung queues its promotions; a promotion already present in the storage (in
  any state) is not queued again, and a queued copy that lost a race to an
  equal older one is dropped when asked (:func:`superseded_copy`), so two
  workers deciding at once run it once.
* **The front takes each policy's highest rung**
  (:func:`precsearch.search.front.trial_rows`): a policy promoted and found
  unstable or diverged at a longer rung leaves the front even though its short
  trial looked feasible; it is not promoted further.

The promotion rule (:func:`select`): the rung's feasible trials, one per
policy (the lowest trial number among equal params), sorted into Pareto
layers over the study's objectives; whole layers are taken in order (the
front first) while they fit in ``promote``; from the layer that does not fit,
the places left go to trials spread evenly along it by the first objective
(memory saved): its two ends first, so with room for one, the most memory
saved. Infeasible and diverged trials are never promoted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from precsearch.config.fidelity import FidelitySection
from precsearch.search.pareto import pareto_indices
from precsearch.search.scoring import DIRECTIONS

#: User attr: the probe length (rung) a trial was scored at.
FIDELITY = "fidelity_steps"
#: User attr: the trial of the previous rung a promoted trial continues.
PROMOTED_FROM = "promoted_from"


def rung_of(trial: FrozenTrial, first: int) -> int:
    """The rung ``trial`` runs at; ``first`` (``probe.steps``) for a trial of a study without rungs."""
    return int(trial.user_attrs.get(FIDELITY, first))


def is_promoted(trial: FrozenTrial) -> bool:
    """True for a promoted evaluation (not one of the study's ``n_trials`` policies)."""
    return PROMOTED_FROM in trial.user_attrs


def policy_key(params: dict[str, Any]) -> str:
    """The same string for trials of the same policy (equal params)."""
    return json.dumps(params, sort_keys=True, default=str)


@dataclass
class Plan:
    """What a worker should do next once the first rung has its ``n_trials``.

    Attributes:
        action: ``run`` (ask for a queued trial), ``wait`` (trials still running decide the next
            rung) or ``done`` (every rung decided and run).
        promote: ``(trial, next rung)`` pairs to queue before asking.
    """

    action: str
    promote: list[tuple[FrozenTrial, int]] = field(default_factory=list)


def plan(trials: list[FrozenTrial], fidelity: FidelitySection, objectives: list[str]) -> Plan:
    """The next step of the promotion scheme, read from the study's trials (see the module docstring)."""
    by_rung = {r: [t for t in trials if rung_of(t, fidelity.rungs[0]) == r] for r in fidelity.rungs}
    if any(t.state is TrialState.WAITING for t in trials if is_promoted(t)):
        return Plan("run")
    for rung in fidelity.rungs:
        if any(t.state is TrialState.RUNNING for t in by_rung[rung]):
            return Plan("wait")
        following = fidelity.next_rung(rung)
        if following is None:
            break
        chosen, claimed = _choice(by_rung[rung], by_rung[following], fidelity.promote, objectives)
        missing = [(t, following) for t in chosen if t.number not in claimed]
        if missing:
            return Plan("run", missing)
    return Plan("done")


def spent(trials: list[FrozenTrial], fidelity: FidelitySection, objectives: list[str]) -> set[int]:
    """Trials whose checkpoint nothing will continue from any more.

    A complete trial that is not feasible (never promoted); one whose rung was decided without it
    (nothing of that rung running or queued, and every trial :func:`select` chose already claimed by
    the next rung); and one whose promoted successor has completed. A worker that later needs a deleted
    checkpoint runs its rung from step 0 (:mod:`precsearch.search.rungs`): the same run, slower.
    """
    done = [t for t in trials if t.state is TrialState.COMPLETE]
    gone = {t.number for t in done if not t.user_attrs.get("score", {}).get("feasible")}
    gone |= {t.user_attrs[PROMOTED_FROM] for t in done if is_promoted(t)}
    by_rung = {r: [t for t in trials if rung_of(t, fidelity.rungs[0]) == r] for r in fidelity.rungs}
    for rung in fidelity.rungs[:-1]:
        if any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in by_rung[rung]):
            continue
        chosen, claimed = _choice(by_rung[rung], by_rung[fidelity.next_rung(rung)], fidelity.promote, objectives)
        numbers = {t.number for t in chosen}
        if numbers <= claimed:
            gone |= {t.number for t in by_rung[rung] if t.number not in numbers}
    return gone


def _choice(at_rung: list[FrozenTrial], following: list[FrozenTrial], k: int,
            objectives: list[str]) -> tuple[list[FrozenTrial], set[int]]:
    """The trials of one rung :func:`select` promotes, and the numbers the next rung already continues."""
    chosen = select([t for t in at_rung if t.state is TrialState.COMPLETE], k, objectives)
    return chosen, {t.user_attrs[PROMOTED_FROM] for t in following if is_promoted(t)}


def select(trials: list[FrozenTrial], k: int, objectives: list[str]) -> list[FrozenTrial]:
    """At most ``k`` of ``trials`` (one rung's complete trials) to promote, by the rule in the module docstring."""
    unique: dict[str, FrozenTrial] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if t.user_attrs.get("score", {}).get("feasible"):
            unique.setdefault(policy_key(t.params), t)
    remaining = list(unique.values())
    directions = [DIRECTIONS[n] for n in objectives]
    chosen: list[FrozenTrial] = []
    while remaining and len(chosen) < k:
        points = [[t.user_attrs["score"][n] for n in objectives] for t in remaining]
        layer = [remaining[i] for i in pareto_indices(points, directions)]
        room = k - len(chosen)
        chosen += layer if len(layer) <= room else _spread(layer, room, objectives[0])
        remaining = [t for t in remaining if t not in layer]
    return chosen


def _spread(layer: list[FrozenTrial], m: int, objective: str) -> list[FrozenTrial]:
    """``m`` trials evenly spaced along ``layer`` sorted by ``objective`` (best first), its ends included."""
    sign = -1 if DIRECTIONS[objective] == "maximize" else 1
    ordered = sorted(layer, key=lambda t: (sign * t.user_attrs["score"][objective], t.number))
    if m == 1:
        return ordered[:1]
    picks = sorted({round(i * (len(ordered) - 1) / (m - 1)) for i in range(m)})
    return [ordered[i] for i in picks]


def enqueue(study: optuna.Study, promote: list[tuple[FrozenTrial, int]]) -> None:
    """Queue each ``(trial, rung)`` as a new trial of the same params continuing ``trial``."""
    for trial, rung in promote:
        study.enqueue_trial(trial.params, user_attrs=promotion_attrs(trial.number, rung))


def promotion_attrs(source: int, rung: int) -> dict[str, int]:
    """The user attrs that make a queued trial the promotion of trial ``source`` to ``rung``."""
    return {FIDELITY: rung, PROMOTED_FROM: source}


def superseded_copy(trial: FrozenTrial, trials: list[FrozenTrial]) -> FrozenTrial | None:
    """An older queued, running or complete trial of the same promotion as ``trial``, or None.

    Two workers deciding a rung at the same moment (PostgreSQL, several machines) may both queue a
    promotion; the younger copy is dropped when it is asked for. Failed copies do not count: an
    interrupted or stale trial is queued again under the same attrs on purpose.
    """
    if not is_promoted(trial):
        return None
    same = (trial.user_attrs[PROMOTED_FROM], trial.user_attrs[FIDELITY])
    live = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE)
    for other in trials:
        if other.number < trial.number and other.state in live and is_promoted(other) \
                and (other.user_attrs[PROMOTED_FROM], other.user_attrs[FIDELITY]) == same:
            return other
    return None


def rung_warnings(study: optuna.Study, number: int) -> list[str]:
    """Warnings for exporting trial ``number``: its verdict comes only from the shortest rung, or a
    longer rung of the same policy has a verdict of its own. Empty for a study without rungs."""
    fidelity = (study.user_attrs.get("space", {}).get("study") or {}).get("fidelity")
    if not fidelity or len(fidelity["rungs"]) < 2:
        return []
    rungs = fidelity["rungs"]
    trials = study.get_trials(deepcopy=False)
    trial = next(t for t in trials if t.number == number)
    rung = rung_of(trial, rungs[0])
    longer = [t for t in trials if t.state is TrialState.COMPLETE and "score" in t.user_attrs
              and policy_key(t.params) == policy_key(trial.params) and rung_of(t, rungs[0]) > rung]
    warnings = []
    if longer:
        best = max(longer, key=lambda t: rung_of(t, rungs[0]))
        verdict = "feasible" if best.user_attrs["score"].get("feasible") else "not feasible"
        warnings.append(f"trial {number} ({rung} steps) is superseded by trial {best.number}, the same policy "
                        f"at {rung_of(best, rungs[0])} steps, where it is {verdict}")
    elif rung == rungs[0]:
        warnings.append(f"trial {number}'s verdict comes only from the shortest rung ({rung} steps): it was "
                        f"not promoted to a longer probe (rungs {rungs}); its stability over a longer run is "
                        f"untested")
    return warnings
