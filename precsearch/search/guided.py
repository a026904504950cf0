"""The sensitivity-guided start of a study: score units once, queue the integer program's candidates.

With ``search.sensitivity`` in the space, the first run of a study (before its first
trial) trains the BF16 probe once, scores every searched unit x precision
(:mod:`precsearch.search.sensitivity`), logs the table and heatmap to the study's
MLflow parent run, solves the integer program for a sweep of memory (or, with
``budget_on: speed``, predicted GEMM-time) budgets
(:mod:`precsearch.search.candidates`) and queues each distinct assignment with
``study.enqueue_trial``. Queued trials are probed, scored and recorded like any
trial; once they are used up the sampler continues, its model fed by them. The
table is kept in the study (user attr ``sensitivity``), so a resumed study does not
measure again and every trial, sampled or queued, gets its predicted instability and
memory beside the measured ones.
"""

from __future__ import annotations

from typing import Any, Callable

import optuna

from precsearch.config.space import Space
from precsearch.probe.data import load_batches
from precsearch.search.candidates import sweep
from precsearch.search.sensitivity import SensitivityTable, measure, predict
from precsearch.tracking.sensitivity_report import sensitivity_artifacts

TABLE_ATTR = "sensitivity"


def table_of(study: optuna.Study) -> SensitivityTable | None:
    """The study's sensitivity table, or None (no sensitivity pass)."""
    data = study.user_attrs.get(TABLE_ATTR)
    return SensitivityTable.from_dict(data) if data else None


def start(space: Space, study: optuna.Study, device: Any, log: Callable[[str, bytes], None],
          say: Callable[[str], None]) -> SensitivityTable | None:
    """Measure, log and queue once per study; later runs read the stored table. None without the section."""
    if space.search.sensitivity is None:
        return None
    stored = table_of(study)
    if stored is not None:
        return stored
    say("sensitivity pass: training the BF16 probe once and scoring every unit x precision")
    table = measure(space, load_batches(space), device)
    for name, data in sensitivity_artifacts(table.to_dict()).items():
        log(name, data)
    candidates = sweep(table, space.search.sensitivity.budgets, space.search.sensitivity.budget_on)
    for k, cand in enumerate(candidates):
        study.enqueue_trial(cand.params, skip_if_exists=True, user_attrs={
            "candidate": k, "predicted_instability": cand.predicted_instability,
            "predicted_memory_saved": cand.predicted_memory_saved, "predicted_speed_gain": cand.predicted_speed_gain,
            "candidate_budget": cand.budget})
    study.set_user_attr(TABLE_ATTR, table.to_dict())
    say(f"sensitivity pass ({table.estimator}, {table.wall_s:.1f} s): {len(table.rows)} unit x precision "
        f"effects; queued {len(candidates)} candidates from {space.search.sensitivity.budgets} "
        f"{space.search.sensitivity.budget_on} budgets")
    for k, cand in enumerate(candidates):
        say(f"  candidate {k}: predicted memory saved {100 * cand.predicted_memory_saved:.2f}%, GEMM time saved "
            f"{100 * cand.predicted_speed_gain:.1f}% (predicted), instability "
            f"{100 * cand.predicted_instability:.4f}%, {_low_precision_count(cand.params)} units low-precision")
    return table


def _low_precision_count(params: dict[str, str]) -> str:
    """``"k/n"``: how many of the assignment's units run a low precision (FP8 or FP4)."""
    return f"{sum(v != 'bf16' for v in params.values())}/{len(params)}"


def predicted_metrics(table: SensitivityTable | None, params: dict[str, Any]) -> dict[str, float]:
    """``predicted_instability``, ``predicted_memory_saved`` and ``predicted_speed_gain`` of a trial's params
    (none without a table)."""
    if table is None:
        return {}
    instability, memory, speed = predict(table, params)
    return {"predicted_instability": instability, "predicted_memory_saved": memory, "predicted_speed_gain": speed}
