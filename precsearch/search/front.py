"""Trial rows and the Pareto front, read from an Optuna study.

In a study with fidelity rungs a policy can have a trial at each rung it
reached; its row is the trial of the highest rung (the longest probe's
verdict), the lower ones are superseded (:mod:`precsearch.search.promotion`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import optuna
from optuna.trial import TrialState

from precsearch.instability import BANDS, MARGIN, Reading, StudyUnit, number
from precsearch.readings import DEFAULT_READING, get_reading
from precsearch.recipes import STANDARD_FP8_NAME
from precsearch.search.pareto import INTERVAL_SE, distinct, pareto_indices
from precsearch.search.promotion import PROMOTED_FROM, policy_key, rung_of
from precsearch.search.scoring import DIRECTIONS, noise_text
from precsearch.tracking.front_report import rate_text


#: A per-module unit's param without ``precision.``: ``L3.linear_fc1`` (block 3's ``linear_fc1``).
_BLOCK_UNIT = re.compile(r"L(\d+)\.(.+)")
#: A module searched per block in at least this many blocks is summarised as a count per choice.
SUMMARISED_BLOCKS = 4


def policy_summary(params: dict[str, Any]) -> str:
    """A one-line summary of a trial's searched params (``attention=fp8_delayed warmup_steps=10``).

    A module searched block by block in :data:`SUMMARISED_BLOCKS` blocks or more is one item, its blocks' choices
    counted, most first (``linear_fc1[30]=bf16:12,fp8_current:10,fp8_delayed:8``): SmolLM2's per-module space has
    121 units, a line each would be 121 items. Each block's choice is in the trial's params (MLflow, front.json)
    and its export.
    """
    short = {k.removeprefix("precision.").removeprefix("recipe."): v for k, v in params.items()}
    units = {name: _BLOCK_UNIT.fullmatch(name) for name in short}
    blocks: dict[str, list[Any]] = {}
    for name, value in short.items():
        if unit := units[name]:
            blocks.setdefault(unit[2], []).append(value)
    items, shown = [], set()
    for name, value in short.items():
        unit = units[name]
        if unit is None or len(blocks[unit[2]]) < SUMMARISED_BLOCKS:
            items.append(f"{name}={value}")
        elif unit[2] not in shown:
            shown.add(unit[2])
            counts = Counter(blocks[unit[2]]).most_common()
            items.append(f"{unit[2]}[{len(blocks[unit[2]])}]=" + ",".join(f"{v}:{n}" for v, n in counts))
    return " ".join(items)


def trial_rows(study: optuna.Study, objectives: list[str]) -> list[dict[str, Any]]:
    """One row per finished trial with its score, ``pareto`` set over the feasible trials.

    Of front trials that no interval separates on any objective (memory equal, the same band, readings and
    speeds within each other's intervals), the one with the smallest reading (then the earliest) is on the
    front and the others are not: each of their rows has ``front_twin``, that trial's number.

    Trials in the ``stable`` band count as equally safe, and so do others whose instability intervals
    (± :data:`~precsearch.search.pareto.INTERVAL_SE` standard errors, where the reading has one) overlap in the
    same band, so the front is the memory and speed trade-off among trials equally safe, plus the riskier
    trials (near the limit) that buy more of either. Speeds whose intervals overlap (± ``INTERVAL_SE`` standard
    errors of each run's own step times, :mod:`precsearch.probe.measure.step_rate`) count as equal too. A trial
    superseded by a higher rung of the same policy has no row. Each row also gives its instability in the study's
    one unit (:mod:`precsearch.instability`): ``instability_in_unit``, ``instability_unit`` (its name),
    ``instability_limit`` and ``instability_band``; where the study read the standard FP8 recipe, also
    ``instability_vs_standard``, ``instability_standard`` and ``standard_recipe``.
    """
    first = study.user_attrs.get("space", {}).get("probe", {}).get("steps", 0)
    unit = StudyUnit.of(study.user_attrs.get("space", {}).get("objectives", {}))
    rows = highest_rungs([_row(t, first, unit)
                          for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                          if "score" in t.user_attrs])
    feasible = [r for r in rows if r["feasible"]]
    coordinates = [_pareto_coordinates(r, objectives) for r in feasible]
    directions = [d for name in objectives for d in (["minimize"] * 2 if name == "instability" else [DIRECTIONS[name]])]
    points, spreads = [c[0] for c in coordinates], [c[1] for c in coordinates]
    # of front trials no interval separates, the smallest reading stands for them (then the earliest trial)
    on_front = sorted(pareto_indices(points, directions, spreads),
                      key=lambda i: (feasible[i]["instability"], feasible[i]["trial"]))
    twins = distinct(on_front, points, spreads)
    for r in rows:
        r["pareto"] = False
    for i, twin in twins.items():
        feasible[i]["pareto"] = twin is None
        if twin is not None:
            feasible[i]["front_twin"] = feasible[twin]["trial"]
    return rows


def _pareto_coordinates(row: dict[str, Any], objectives: list[str]) -> tuple[list[float], list[float]]:
    """A row's point and spreads for the front. Instability is two coordinates: the band's rank (stable before
    near the limit), then the reading with its interval, except in the ``stable`` band, where every reading
    counts as equal (all clear of the limit by its margin: a reading at 1% of the limit is no safer to act on
    than one at 50%, and the front would otherwise keep trials that only buy a smaller reading)."""
    point: list[float] = []
    spread: list[float] = []
    for name in objectives:
        if name != "instability":  # speed has its interval where the probe timed enough steps; memory is exact
            point.append(row[name])
            spread.append(INTERVAL_SE * row.get(f"{name}_se", math.nan))
            continue
        stable = row["instability_band"] == "stable"
        point += [float(_band_rank(row)), 0.0 if stable else row["instability"]]
        spread += [0.0, 0.0 if stable else INTERVAL_SE * row["instability_se"]]
    return point, spread


def highest_rungs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` less those of a policy (equal params) that also has a row at a higher rung."""
    top: dict[str, int] = {}
    for r in rows:
        key = policy_key(r["params"])
        top[key] = max(top.get(key, 0), r["fidelity_steps"])
    return [r for r in rows if r["fidelity_steps"] == top[policy_key(r["params"])]]


def _row(trial: optuna.trial.FrozenTrial, first_rung: int, unit: StudyUnit) -> dict[str, Any]:
    score = trial.user_attrs["score"]
    reading = unit.read(score)
    return {
        "trial": trial.number,
        "fidelity_steps": rung_of(trial, first_rung),
        "promoted_from": trial.user_attrs.get(PROMOTED_FROM),
        "memory_saved": score["memory_saved"],
        "instability": score["instability"],
        "instability_se": score.get("damage_se", math.nan),  # the damage reading's standard error; none otherwise
        "instability_in_unit": reading.value,
        "instability_unit": unit.name,
        "instability_limit": unit.limit,
        "instability_band": reading.band,
        "instability_figure": reading.figure,
        "loss_gap": score["loss_gap"],
        "noise_floor": score.get("noise_floor", math.nan),
        "gap_in_noise": score.get("gap_in_noise", math.nan),
        "reading": score.get("reading", DEFAULT_READING),
        "damage_measure": score.get("damage_measure", ""),
        "tokens_per_s": score["tokens_per_s"],
        "tokens_per_s_se": score.get("tokens_per_s_se", math.nan),  # its own steps' noise (probe.measure.step_rate)
        "feasible": score["feasible"],
        "diverged": score["diverged"],
        "nonfinite": score.get("nonfinite", ""),
        "memory_source": trial.user_attrs.get("memory_source", ""),
        "memory_sources": trial.user_attrs.get("memory_sources", ""),
        "memory_framework": score.get("memory_framework", ""),
        "memory_saved_own": _own_saving(score),
        "speedup": score.get("speedup", math.nan),
        "speedup_framework": score.get("speedup_framework", math.nan),  # the target's, predicted, where it is
        "speedup_probe": score.get("speedup_probe", math.nan),
        "speedup_note": score.get("speedup_note", ""),  # why the target's speed-up is not predicted, where it is not
        "policy": policy_summary(trial.params),
        "params": dict(trial.params),
        "mlflow_run_id": trial.user_attrs.get("mlflow_run_id"),
    } | _beside_standard(reading)


def _own_saving(score: dict[str, Any]) -> float:
    """What precsearch's own probe and optimizer save running the trial: at the target model where the study
    predicted one, else on the probe."""
    target = score.get("memory_saved_target", math.nan)
    return target if isinstance(target, float) and math.isfinite(target) else score.get("memory_saved_probe", math.nan)


def _beside_standard(reading: Reading) -> dict[str, Any]:
    """The standard FP8 recipe's reading at the trial's states and clip value, what it ran, and the trial's multiple
    of it; no keys where there is none (every output then says nothing of it)."""
    if reading.multiple == "-":
        return {}
    return {"instability_standard": reading.standard, "standard_recipe": reading.standard_recipe,
            "instability_vs_standard": reading.vs_standard}


def format_table(rows: list[dict[str, Any]], flags: bool = False, target: str | None = None) -> str:
    """A plain-text table of rows, best memory saving first; ``flags`` adds feasible and pareto columns.

    Instability is in the study's one unit (named above the table, with the limit) and its band, as the
    terminal's trial lines give them (:mod:`precsearch.instability`). ``target``: a line naming the study's
    target, above the table. A row's ``runs_as_is_in`` (the targets that run its policy as it is, where the
    caller added them) closes its line. A study whose target is a framework scored that framework's saving
    (``memory_framework``): the row then ends with precsearch's own (``memory_saved_own``); a study stored before
    that, with what the target saves running it (``target_memory_saved``, predicted)."""
    extra = f"  {'feasible':>8}  {'pareto':>6}" if flags else ""
    width = max([11] + [len(_instability(r)) for r in rows])
    standard = _standard_line(rows)  # a column only where the study read the standard FP8 recipe
    beside = f"  {'vs standard':>11}" if standard else ""
    header = (f"{'trial':>5}  {'mem saved':>9}  {'instability':>{width}}{beside}  {'band':<14}  {'loss gap':>8}  "
              f"{'BF16 seed noise':>16}  {'tok/s':>14}  {'steps':>6}{extra}  policy")
    lines = ([target] if target else []) + [_unit_line(rows)] + ([standard] if standard else []) \
        + [header, "-" * len(header)]
    for r in sorted(rows, key=lambda r: -r["memory_saved"]):
        gap = "diverged" if r["diverged"] else f"{100 * r['loss_gap']:+7.2f}%"
        own_unit = get_reading(r.get("reading")).own_unit  # instability in the reading's own measure, not the floor's
        noise = "-" if r["diverged"] or own_unit else noise_text(r["noise_floor"], r["gap_in_noise"])
        marks = f"  {_yes(r['feasible']):>8}  {_pareto_mark(r):>6}" if flags else ""
        # where the saving comes from, last: one row per line, the columns before it unchanged
        sources = f"  [saved from: {r['memory_sources']}]" if r.get("memory_sources") else ""
        sources += f"  [{r['nonfinite']}]" if r.get("nonfinite") else ""
        sources += f"  [runs as-is in: {r['runs_as_is_in']}]" if r.get("runs_as_is_in") else ""
        if r.get("memory_framework"):  # mem saved is the framework's: precsearch's own figure beside it
            sources += f"  [precsearch itself: memory saved {100 * r['memory_saved_own']:.2f}%{_own_speed(r)}]"
        elif "target_memory_saved" in r:  # a study that scored precsearch's figure: what its target saves, predicted
            sources += f"  [target: memory saved {100 * r['target_memory_saved']:.2f}% predicted]"
        multiple = f"  {_multiple(r):>11}" if standard else ""
        lines.append(f"{r['trial']:>5}  {100 * r['memory_saved']:8.2f}%  {_instability(r):>{width}}{multiple}  "
                     f"{r.get('instability_band', '-'):<14}  {gap:>8}  {noise:>16}  {rate_text(r):>14}  "
                     f"{r['fidelity_steps']:>6}{marks}  "
                     f"{r['policy']}{sources}")
    notes = dict.fromkeys(r["speedup_note"] for r in rows if r.get("speedup_note"))
    if notes:  # a framework target's speed-up not predicted: say why once, not on every row
        lines.append("speed-up: the probe's, since " + "; ".join(notes))
    if flags and any("front_twin" in r for r in rows):
        lines.append("pareto '= N': as good as front trial N on every objective, within the intervals; of such "
                     "trials the front lists the one with the smallest reading")
    return "\n".join(lines)


def _own_speed(row: dict[str, Any]) -> str:
    """``, speed-up 1.06x; in megatron: speed-up 1.18x, predicted`` where the row's speed-up is its framework
    target's, predicted (the probe's first); else ""."""
    predicted, own = row.get("speedup_framework", math.nan), row.get("speedup_probe", math.nan)
    if not (math.isfinite(predicted) and math.isfinite(own)):
        return ""
    return f", speed-up {own:.2f}x; in {row['memory_framework']}: speed-up {predicted:.2f}x, predicted"


def _instability(row: dict[str, Any]) -> str:
    """The row's instability as the trial line printed it: ``1.98``, ``0.00138 ± 0.00062 (2 SE)``."""
    return row.get("instability_figure") or number(row["instability"])


def _multiple(row: dict[str, Any]) -> str:
    """The row's multiple of the standard FP8 recipe's reading as the trial line printed it (``1.3x``), or ``-``."""
    return Reading(row["instability"], math.nan, StudyUnit("", math.nan), row.get("instability_standard", math.nan),
                   "", row.get("instability_vs_standard", math.nan)).multiple


def _standard_line(rows: list[dict[str, Any]]) -> str:
    """What the ``vs standard`` column is a multiple of, and the limit as a multiple of it: ``vs standard: the
    instability as a multiple of the standard FP8 recipe's at the same states and clip value (...): 0.00124 (the
    limit is 1.6x it)``; "" where no row has one."""
    read = [r for r in rows if _multiple(r) != "-"]
    if not read:
        return ""
    limit = read[0].get("instability_limit", math.nan)
    values = dict.fromkeys((r["instability_standard"], number(r["instability_standard"], limit)) for r in read)
    shown = [f"{text} (the limit is {limit / value:.2g}x it)" if value > 0 and math.isfinite(limit) else text
             for value, text in values]
    per_clip = " (one per clip value)" if len(values) > 1 else ""
    return (f"vs standard: the instability as a multiple of {STANDARD_FP8_NAME}'s at the same states and clip value "
            f"({read[0]['standard_recipe']}): {', '.join(shown)}{per_clip}")


def nearest_to_feasible(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The least unstable trial that did not diverge: the best band, then the smallest reading, then the first
    (None where no row carries a reading)."""
    read = [r for r in rows if "instability" in r and not r.get("diverged")]
    return min(read, key=lambda r: (_band_rank(r), r["instability"], r["trial"]), default=None)


def _band_rank(row: dict[str, Any]) -> int:
    """The row's band in :data:`~precsearch.instability.BANDS`' order (stable first); a row without one last."""
    band = row.get("instability_band")
    return BANDS.index(band) if band in BANDS else len(BANDS)


def no_front_text(rows: list[dict[str, Any]]) -> str:
    """What to print in place of an empty front: how many trials finished, none feasible, the one nearest to
    feasible (:func:`nearest_to_feasible`), and where to look."""
    if not rows:
        return "no finished feasible trial yet (no trial has finished)"
    text = f"no finished feasible trial yet: none of the {len(rows)} finished trial(s) is feasible"
    if (least := nearest_to_feasible(rows)) is not None:
        band = f", {least['instability_band']}" if least.get("instability_band") else ""
        text += (f"; the least unstable is trial {least['trial']} ({_instability(least)}{band}; "
                 f"memory saved {100 * least['memory_saved']:.2f}%)")
    return text + "; `precsearch front --all` lists each with its instability, band and loss gap"


def _unit_line(rows: list[dict[str, Any]]) -> str:
    """The unit the table's instability is in, and the limit in it."""
    row = rows[0] if rows else {}
    return (f"instability in {row.get('instability_unit', '(unit not stored)')}; limit "
            f"{number(row.get('instability_limit', math.nan))}; band 'stable': at most {100 * (1 - MARGIN):g}% of "
            "the limit (the reading + 2 SE where it has one)")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _pareto_mark(row: dict[str, Any]) -> str:
    """``yes``, ``no``, or ``= 7``: off the front as one with front trial 7 within every interval."""
    return f"= {row['front_twin']}" if "front_twin" in row else _yes(row["pareto"])
