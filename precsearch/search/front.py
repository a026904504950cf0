"""Trial rows and the Pareto front, read from an Optuna study.

In a study with fidelity rungs a policy can have a trial at each rung it
reached; its row is the trial of the highest rung (the longest probe's
verdict), the lower ones are superseded (:mod:`precsearch.search.promotion`).
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import TrialState

from precsearch.search.pareto import pareto_indices
from precsearch.search.promotion import PROMOTED_FROM, policy_key, rung_of
from precsearch.search.scoring import DIRECTIONS, noise_text


def policy_summary(params: dict[str, Any]) -> str:
    """A one-line summary of a trial's searched params (``attention=fp8_delayed warmup_steps=10``)."""
    short = {k.removeprefix("precision.").removeprefix("recipe."): v for k, v in params.items()}
    return " ".join(f"{k}={v}" for k, v in short.items())


def trial_rows(study: optuna.Study, objectives: list[str]) -> list[dict[str, Any]]:
    """One row per finished trial with its score, ``pareto`` set over the feasible trials.

    A trial superseded by a higher rung of the same policy has no row.
    """
    first = study.user_attrs.get("space", {}).get("probe", {}).get("steps", 0)
    rows = highest_rungs([_row(t, first) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                          if "score" in t.user_attrs])
    feasible = [r for r in rows if r["feasible"]]
    points = [[r[name] for name in objectives] for r in feasible]
    front = {feasible[i]["trial"] for i in pareto_indices(points, [DIRECTIONS[n] for n in objectives])}
    for r in rows:
        r["pareto"] = r["trial"] in front
    return rows


def highest_rungs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` less those of a policy (equal params) that also has a row at a higher rung."""
    top: dict[str, int] = {}
    for r in rows:
        key = policy_key(r["params"])
        top[key] = max(top.get(key, 0), r["fidelity_steps"])
    return [r for r in rows if r["fidelity_steps"] == top[policy_key(r["params"])]]


def _row(trial: optuna.trial.FrozenTrial, first_rung: int) -> dict[str, Any]:
    score = trial.user_attrs["score"]
    return {
        "trial": trial.number,
        "fidelity_steps": rung_of(trial, first_rung),
        "promoted_from": trial.user_attrs.get(PROMOTED_FROM),
        "memory_saved": score["memory_saved"],
        "instability": score["instability"],
        "loss_gap": score["loss_gap"],
        "noise_floor": score.get("noise_floor", math.nan),
        "gap_in_noise": score.get("gap_in_noise", math.nan),
        "reading": score.get("reading", "final"),
        "damage_measure": score.get("damage_measure", ""),
        "tokens_per_s": score["tokens_per_s"],
        "feasible": score["feasible"],
        "diverged": score["diverged"],
        "memory_source": trial.user_attrs.get("memory_source", ""),
        "memory_sources": trial.user_attrs.get("memory_sources", ""),
        "policy": policy_summary(trial.params),
        "params": dict(trial.params),
        "mlflow_run_id": trial.user_attrs.get("mlflow_run_id"),
    }


def format_table(rows: list[dict[str, Any]], flags: bool = False) -> str:
    """A plain-text table of rows, best memory saving first; ``flags`` adds feasible and pareto columns."""
    extra = f"  {'feasible':>8}  {'pareto':>6}" if flags else ""
    header = (f"{'trial':>5}  {'mem saved':>9}  {'instab.':>8}  {'loss gap':>8}  {'BF16 seed noise':>16}  "
              f"{'tok/s':>8}  {'steps':>6}{extra}  policy")
    lines = [header, "-" * len(header)]
    for r in sorted(rows, key=lambda r: -r["memory_saved"]):
        gap = "diverged" if r["diverged"] else f"{100 * r['loss_gap']:+7.2f}%"
        damage = r.get("reading") == "damage"  # instability is the fixed-state reading, in its own measure
        noise = "-" if r["diverged"] or damage else noise_text(r["noise_floor"], r["gap_in_noise"])
        instab = f"{r['instability']:7.3g}x" if damage else f"{100 * r['instability']:7.3f}%"
        marks = f"  {_yes(r['feasible']):>8}  {_yes(r['pareto']):>6}" if flags else ""
        # where the saving comes from, last: one row per line, the columns before it unchanged
        sources = f"  [saved from: {r['memory_sources']}]" if r.get("memory_sources") else ""
        lines.append(f"{r['trial']:>5}  {100 * r['memory_saved']:8.2f}%  {instab:>8}  "
                     f"{gap:>8}  {noise:>16}  {r['tokens_per_s']:8.0f}  {r['fidelity_steps']:>6}{marks}  "
                     f"{r['policy']}{sources}")
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
