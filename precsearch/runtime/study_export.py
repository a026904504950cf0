"""``precsearch export``: a finished trial of a study -> policy file (or framework files) with provenance.

What reads the study lives here, in the runtime: the trial's policy and its provenance, the pick rules
applied to the study's rows, and the verdict on an infeasible trial. The files themselves are rendered
by :mod:`precsearch.export`, which knows no study.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass, field
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from precsearch.config.space import ModelSection
from precsearch.errors import UserError
from precsearch.export.format_output import block_ranges
from precsearch.export.pick import DEFAULT_MARGIN, Margin, choose_trial
from precsearch.export.as_run import as_searched
from precsearch.export.registry import FORMATS, TARGETS, as_run, render
from precsearch.instability import StudyUnit
from precsearch.policy import Policy
from precsearch.policy.file import dump_policy
from precsearch.readings import reading_of
from precsearch.runtime.export_cost import ExportCost, export_cost
from precsearch.runtime.workspace import Workspace
from precsearch.search.duplicate_trials import DUPLICATE_OF
from precsearch.search.front import trial_rows
from precsearch.version import __version__


def trial_policy(study: optuna.Study, ws: Workspace, number: int) -> tuple[Policy, dict[str, Any]]:
    """The policy of trial ``number`` and its provenance (study, trial, objectives, probe, versions).

    A duplicate (a proposal of a policy already scored, told its twin's result and not run again) gives its
    twin's policy and score, its provenance naming both (``trial`` the number asked for, ``duplicate_of``).
    """
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    source = trials[scored_source(trials, number, ws.study_name)]
    space = study.user_attrs["space"]
    policy = Policy.from_dict(source.user_attrs["policy"])
    score = source.user_attrs.get("score", {})
    provenance = {
        "study": ws.study_name,
        "trial": number,
        **({"duplicate_of": source.number} if source.number != number else {}),
        "objectives": {k: score.get(k) for k in ("memory_saved", "instability", "loss_gap", "tokens_per_s",
                                                 "feasible", "diverged")} | _in_unit(space, score),
        "memory_source": source.user_attrs.get("memory_source"),
        **_target_speed(score),
        "probe": {"model": space["model"], "probe": space["probe"]},
        "backend": space["backend"],
        **({"target": _target(space["target"])} if space.get("target") else {}),
        "versions": {"precsearch": __version__, "torch": str(torch.__version__), "optuna": str(optuna.__version__),
                     "python": platform.python_version()},
    }
    return policy, provenance


def _target_speed(score: dict[str, Any]) -> dict[str, Any]:
    """``{"speed": {framework, speedup, probe}}`` where the study scored its framework target's speed-up, predicted
    (:mod:`precsearch.runtime.target_speed`); else nothing."""
    predicted = score.get("speedup_framework")
    if not (isinstance(predicted, float) and math.isfinite(predicted)):
        return {}
    return {"speed": {"framework": score.get("memory_framework"), "speedup": predicted,
                      "probe": score.get("speedup_probe")}}


def _target(target: dict[str, Any]) -> dict[str, Any]:
    """The study's ``target:`` with its version (the one its export was checked against, when not given)."""
    fmt = TARGETS.get(target["name"])
    return {"name": target["name"], "version": target.get("version") or (FORMATS[fmt].checked if fmt else None)}


def _in_unit(space: dict[str, Any], score: dict[str, Any]) -> dict[str, Any]:
    """The trial's instability in its study's one unit, as the terminal and ``front`` gave it: ``instability`` (the
    value; the raw objective was a fraction of the BF16 loss whatever the unit), its unit's name and limit, the
    band, ± 2 SE where the reading has a standard error, and where the study read the standard FP8 recipe, the
    trial's multiple of that recipe's reading, the reading and what it ran."""
    unit = StudyUnit.of(space.get("objectives", {}))
    reading = unit.read(score)
    found = {"instability": reading.value if reading.number != "-" else None, "instability_unit": unit.name,
             "instability_limit": unit.limit if math.isfinite(unit.limit) else None, "instability_band": reading.band}
    beside = {"instability_vs_standard": reading.vs_standard, "instability_standard": reading.standard,
              "standard_recipe": reading.standard_recipe} if reading.multiple != "-" else {}
    return found | ({"instability_2se": 2 * reading.se} if reading.interval else {}) | beside


#: Why a trial in each state has no policy to export, as the refusal says it.
_UNFINISHED = {TrialState.FAIL: "failed", TrialState.PRUNED: "was pruned", TrialState.RUNNING: "is still running",
               TrialState.WAITING: "is queued and has not run"}


def _twin(trial: FrozenTrial, trials: dict[int, FrozenTrial]) -> FrozenTrial | None:
    """The trial whose probe scored ``trial``'s policy: itself, or its twin's (following duplicates); None if
    there is none (not complete, or a duplicate whose twin is gone)."""
    seen: set[int] = set()
    while trial is not None and trial.state is TrialState.COMPLETE and trial.number not in seen:
        if "policy" in trial.user_attrs:
            return trial
        if DUPLICATE_OF not in trial.user_attrs:
            return None
        seen.add(trial.number)
        trial = trials.get(int(trial.user_attrs[DUPLICATE_OF]))
    return None


def exportable(trials: dict[int, FrozenTrial]) -> dict[int, int]:
    """Trial number -> the number of the trial whose policy and score it exports, for every exportable trial."""
    sources = {n: _twin(t, trials) for n, t in trials.items()}
    return {n: s.number for n, s in sorted(sources.items()) if s is not None}


def scored_source(trials: dict[int, FrozenTrial], number: int, study_name: str) -> int:
    """The number of the trial ``--trial number`` exports (its own, or its twin's for a duplicate).

    Raises:
        UserError: No such trial, or one with no policy (failed, pruned, still running, queued), naming its
            state and the trials that can be exported.
    """
    ok = exportable(trials)
    valid = f"valid: {block_ranges(list(ok))}" if ok else "no trial can be exported yet"
    if number in ok:
        return ok[number]
    if number not in trials:
        raise UserError(f"no trial {number} in study '{study_name}'; {valid}", field="--trial")
    trial = trials[number]
    if trial.state in _UNFINISHED:
        why = f"trial {number} {_UNFINISHED[trial.state]} (state {trial.state.name}): it has no policy to export"
    elif DUPLICATE_OF in trial.user_attrs:
        why = f"trial {number} repeats trial {trial.user_attrs[DUPLICATE_OF]}, which has no policy to export"
    else:
        why = f"trial {number} completed without a recorded policy (state {trial.state.name})"
    raise UserError(f"{why}; {valid}", field="--trial")


def export_trial(study: optuna.Study, ws: Workspace, number: int) -> str:
    """The policy file of trial ``number`` of ``study``."""
    return dump_policy(*trial_policy(study, ws, number))


def target_layers(study: optuna.Study) -> int:
    """Transformer blocks of the model the study searched for (the target, not the shorter probe)."""
    return ModelSection(**study.user_attrs["space"]["model"]).target().n_layers


@dataclass
class Export:
    """One export: which trial, why, and the files (name -> text) with warnings.

    ``source`` is the trial whose probe scored the policy: ``trial`` itself, or its twin for a duplicate.
    ``cost``: for a framework's format, what its files change and what that costs (None for ``policy``).
    """

    trial: int
    reason: str
    files: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    source: int | None = None
    cost: ExportCost | None = None

    def __post_init__(self) -> None:
        if self.source is None:
            self.source = self.trial


def export(study: optuna.Study, ws: Workspace, *, trial: int | None = None, pick: str | None = None,
           max_instability: float | None = None, margin: float | None = None, fmt: str = "policy",
           n_layers: int | None = None, pipeline: int = 1) -> Export:
    """Choose a trial (by number, or by ``pick`` rule) and render it in format ``fmt``.

    Args:
        trial: Trial number; exclusive with ``pick``. A duplicate exports its twin's policy.
        pick: ``max-memory``, ``fastest`` or ``most-stable`` (see :func:`choose_trial`).
        max_instability: Only trials at or below this instability qualify (with ``pick``), in the study's
            ``stability_unit`` (BF16 seed spreads for ``noise``, a fraction of the BF16 loss otherwise).
        margin: With ``pick``: the share of the study's stability limit to keep clear of (default
            :data:`~precsearch.export.pick.DEFAULT_MARGIN`; 0 keeps none), see :class:`Margin`.
        fmt: ``policy``, ``megatron``, ``torchtitan`` or ``accelerate``.
        n_layers: Blocks of the model the files are for (default: the study's target model).
        pipeline: Megatron only: model chunks of the run (pipeline stages x virtual stages).
    """
    if (trial is None) == (pick is None):
        raise UserError("give either a trial number or a rule to pick one", field="--trial/--pick")
    for flag, value in (("--max-instability", max_instability), ("--margin", margin)):
        if value is not None and pick is None:
            raise UserError("only applies with --pick", field=flag)
    if pick is not None:
        trial, reason, chosen_by = _pick(study, pick, max_instability, margin)
    else:
        reason = f"trial {trial} (asked for by number)"
    policy, provenance = trial_policy(study, ws, trial)
    source = provenance.get("duplicate_of", trial)
    if source != trial:
        reason += (f": the same policy as trial {source}, which was run and scored (trial {trial} was not run "
                   f"again); exporting trial {source}'s policy and score")
    if pick is not None:
        provenance["chosen_by"] = chosen_by
    n_layers = n_layers if n_layers is not None else target_layers(study)
    cost = None
    if fmt in FORMATS and FORMATS[fmt].framework:  # an unknown fmt is refused by render, naming the valid ones
        cost = export_cost(study.user_attrs["space"], as_searched(policy, n_layers),
                           as_run(fmt, policy, n_layers, pipeline=pipeline), n_layers)
        provenance["as_written"] = cost.figures()
    rendered = render(fmt, policy, n_layers, provenance, pipeline=pipeline)
    verdict = infeasible_warning(study, source)
    other = _other_target(provenance.get("target"), fmt)
    return Export(trial, reason, rendered.files, [w for w in (verdict, other) if w] + rendered.warnings, source, cost)


def _other_target(target: dict[str, Any] | None, fmt: str) -> str | None:
    """A warning when the study searched for another framework than ``fmt``'s (its choices were not checked
    against this one)."""
    if target is None or fmt not in FORMATS or not FORMATS[fmt].framework or FORMATS[fmt].target == target["name"]:
        return None
    return (f"the study searched for target {target['name']} {target['version']}: its choices were checked "
            f"against {target['name']}, not {FORMATS[fmt].target}")


def _pick(study: optuna.Study, pick: str, max_instability: float | None,
          margin: float | None) -> tuple[int, str, dict[str, Any]]:
    """The trial a ``pick`` rule chooses, the sentence saying why, and the ``chosen_by`` provenance."""
    rows = trial_rows(study, study.user_attrs["objectives"])
    objectives = study.user_attrs.get("space", {}).get("objectives", {})
    unit = StudyUnit.of(objectives)
    keep = Margin(unit.limit, DEFAULT_MARGIN if margin is None else margin)
    row, reason = choose_trial(rows, pick, max_instability, unit, keep)
    chosen_by = {"pick": pick, "max_instability": max_instability, "margin": keep.share, "reason": reason}
    if max_instability is not None:
        chosen_by["max_instability_unit"] = unit.name
    return row["trial"], reason, chosen_by


def infeasible_warning(study: optuna.Study, number: int) -> str | None:
    """Why trial ``number`` is not feasible (diverged, or instability over the limit), or None if it is."""
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    score = trial.user_attrs.get("score", {})
    if score.get("feasible", True):
        return None
    if score.get("diverged"):
        return f"trial {number} diverged in its probe: this policy broke training where BF16 did not"
    objectives = study.user_attrs["space"]["objectives"]
    if not score.get("stable", False):
        shown = StudyUnit.of(objectives).read(score).text()
        return f"trial {number} is not feasible: {reading_of(objectives).infeasible_reason(shown)}"
    return (f"trial {number} is not feasible: stable at probe.lr, but not under stress "
            f"(objectives.stress, in the constraint)")


__all__ = ["Export", "export", "export_trial", "exportable", "infeasible_warning", "scored_source", "target_layers",
           "trial_policy"]
