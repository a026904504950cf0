"""``precsearch export``: a finished trial -> policy file text with provenance."""

from __future__ import annotations

import platform

import optuna
import torch
from optuna.trial import TrialState

from precsearch import __version__
from precsearch.errors import UserError
from precsearch.policy.file import dump_policy
from precsearch.policy import Policy
from precsearch.search.workspace import Workspace


def export_trial(study: optuna.Study, ws: Workspace, number: int) -> str:
    """The policy file of trial ``number`` of ``study``."""
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
        "versions": {"precsearch": __version__, "torch": torch.__version__, "optuna": optuna.__version__,
                     "python": platform.python_version()},
    }
    return dump_policy(policy, provenance)
