"""``precsearch export``: a finished trial of a study -> policy file (or framework files) with provenance.

What reads the study lives here, in the runtime: the trial's policy and its provenance, the pick rules
applied to the study's rows, and the verdict on an infeasible trial. The files themselves are rendered
by :mod:`precsearch.export`, which knows no study.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any

import optuna
import torch
from optuna.trial import TrialState

from precsearch.config.space import ModelSection, instability_unit
from precsearch.errors import UserError
from precsearch.export.pick import choose_trial
from precsearch.export.registry import render
from precsearch.policy import Policy
from precsearch.policy.file import dump_policy
from precsearch.runtime.workspace import Workspace
from precsearch.search.front import trial_rows
from precsearch.version import __version__


def trial_policy(study: optuna.Study, ws: Workspace, number: int) -> tuple[Policy, dict[str, Any]]:
    """The policy of trial ``number`` and its provenance (study, trial, objectives, probe, versions)."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if number not in trials:
        valid = f"0..{max(trials)}" if trials else "none yet"
        raise UserError(f"no trial {number} in study '{ws.study_name}'; valid: {valid}", field="--trial")
    trial = trials[number]
    if trial.state is not TrialState.COMPLETE:
        raise UserError(f"trial {number} did not complete (state {trial.state.name}); export a completed trial",
                        field="--trial")
    space = study.user_attrs["space"]
    policy = Policy.from_dict(trial.user_attrs["policy"])
    score = trial.user_attrs.get("score", {})
    provenance = {
        "study": ws.study_name,
        "trial": number,
        "objectives": {k: score.get(k) for k in ("memory_saved", "instability", "loss_gap", "tokens_per_s",
                                                 "feasible", "diverged")},
        "memory_source": trial.user_attrs.get("memory_source"),
        "probe": {"model": space["model"], "probe": space["probe"]},
        "backend": space["backend"],
        "versions": {"precsearch": __version__, "torch": str(torch.__version__), "optuna": str(optuna.__version__),
                     "python": platform.python_version()},
    }
    return policy, provenance


def export_trial(study: optuna.Study, ws: Workspace, number: int) -> str:
    """The policy file of trial ``number`` of ``study``."""
    return dump_policy(*trial_policy(study, ws, number))


def target_layers(study: optuna.Study) -> int:
    """Transformer blocks of the model the study searched for (the target, not the shorter probe)."""
    return ModelSection(**study.user_attrs["space"]["model"]).target().n_layers


@dataclass
class Export:
    """One export: which trial, why, and the files (name -> text) with warnings."""

    trial: int
    reason: str
    files: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def export(study: optuna.Study, ws: Workspace, *, trial: int | None = None, pick: str | None = None,
           max_instability: float | None = None, fmt: str = "policy", n_layers: int | None = None,
           pipeline: int = 1) -> Export:
    """Choose a trial (by number, or by ``pick`` rule) and render it in format ``fmt``.

    Args:
        trial: Trial number; exclusive with ``pick``.
        pick: ``max-memory``, ``fastest`` or ``most-stable`` (see :func:`choose_trial`).
        max_instability: Only trials at or below this instability qualify (with ``pick``), in the study's
            ``stability_unit`` (BF16 seed spreads for ``noise``, a fraction of the BF16 loss otherwise).
        fmt: ``policy``, ``megatron``, ``torchtitan`` or ``accelerate``.
        n_layers: Blocks of the model the files are for (default: the study's target model).
        pipeline: Megatron only: model chunks of the run (pipeline stages x virtual stages).
    """
    if (trial is None) == (pick is None):
        raise UserError("give either a trial number or a rule to pick one", field="--trial/--pick")
    if max_instability is not None and pick is None:
        raise UserError("only applies with --pick", field="--max-instability")
    if pick is not None:
        rows = trial_rows(study, study.user_attrs["objectives"])
        objectives = study.user_attrs.get("space", {}).get("objectives", {})
        unit = instability_unit(objectives.get("reading", "final"), objectives.get("stability_unit", "relative"))
        row, reason = choose_trial(rows, pick, max_instability, unit)
        trial = row["trial"]
    else:
        reason = f"trial {trial} (asked for by number)"
    policy, provenance = trial_policy(study, ws, trial)
    if pick is not None:
        provenance["chosen_by"] = {"pick": pick, "max_instability": max_instability, "reason": reason}
        if max_instability is not None:
            provenance["chosen_by"]["max_instability_unit"] = unit
    rendered = render(fmt, policy, n_layers if n_layers is not None else target_layers(study), provenance,
                      pipeline=pipeline)
    verdict = infeasible_warning(study, trial)
    return Export(trial, reason, rendered.files, ([verdict] if verdict else []) + rendered.warnings)


def infeasible_warning(study: optuna.Study, number: int) -> str | None:
    """Why trial ``number`` is not feasible (diverged, or instability over the limit), or None if it is."""
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    score = trial.user_attrs.get("score", {})
    if score.get("feasible", True):
        return None
    if score.get("diverged"):
        return f"trial {number} diverged in its probe: this policy broke training where BF16 did not"
    objectives = study.user_attrs["space"]["objectives"]
    limit, unit = objectives["stability_limit"], objectives["stability_unit"]
    if not score.get("stable", False):
        measured = score["instability"]
        if objectives.get("reading") == "damage":
            damage = objectives["damage"]
            return (f"trial {number} is not feasible: its fixed-state damage reads {measured:.3g} "
                    f"({damage.get('measure', 'grad_noise')}; limit objectives.damage.limit {damage['limit']}), "
                    f"or its probe had loss spikes or gradient blow-ups BF16 did not")
        if unit == "noise":
            floor = score.get("noise_floor") or float("nan")
            shown = f"{measured / floor:.2f} BF16 seed spreads" if floor > 0 else "unknown (no noise floor)"
            return (f"trial {number} is not feasible: instability {shown} > objectives.stability_limit {limit} "
                    f"(in noise units); it trained measurably worse than BF16 in its probe")
        return (f"trial {number} is not feasible: instability {100 * measured:.2f}% > objectives.stability_limit "
                f"{100 * limit:.2f}% of the BF16 loss; it trained measurably worse than BF16 in its probe")
    return (f"trial {number} is not feasible: stable at probe.lr, but not under stress "
            f"(objectives.stress, in the constraint)")


__all__ = ["Export", "export", "export_trial", "infeasible_warning", "target_layers", "trial_policy"]
