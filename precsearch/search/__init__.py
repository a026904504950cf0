"""The optimisation: sampling policies (:mod:`.sampling`), scoring trials (:mod:`.scoring`), the Pareto
front (:mod:`.front`), rungs and promotion (:mod:`.rungs`, :mod:`.promotion`), duplicate trials
(:mod:`.duplicate_trials`), a study's summary (:mod:`.summary`) and the sensitivity table. A told trial's
scored record is :mod:`.scored_trial`'s; every reach into Optuna's private API is :mod:`.optuna_adapter`'s.

Running the trials is :mod:`precsearch.runtime`'s. Public names are re-exported here and imported on
first use (Optuna among them).
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["await_twin", "constraint_value", "DIRECTIONS", "DIVERGED_INSTABILITY", "drop_spent", "DUPLICATE_OF",
           "finished_count", "finished_in", "format_table", "instability_text", "MAX_DUPLICATES_IN_A_ROW",
           "measure_noise_floor", "objective_names", "objective_values", "policy_summary", "rung_probe",
           "rung_warnings", "Score", "score", "stability_metrics", "study_metrics", "suggest_policy",
           "tell_duplicate", "trial_leg", "trial_rows", "trial_rung", "unneeded", "verdict",
           "verdict_line"]

_WHERE = {
    "await_twin": "duplicate_trials",
    "DUPLICATE_OF": "duplicate_trials",
    "MAX_DUPLICATES_IN_A_ROW": "duplicate_trials",
    "tell_duplicate": "duplicate_trials",
    "format_table": "front", "policy_summary": "front", "trial_rows": "front",
    "rung_warnings": "promotion",
    "drop_spent": "rungs", "rung_probe": "rungs", "trial_leg": "rungs", "trial_rung": "rungs", "unneeded": "rungs",
    "suggest_policy": "sampling",
    "constraint_value": "scoring",
    "DIRECTIONS": "scoring",
    "DIVERGED_INSTABILITY": "scoring",
    "instability_text": "scoring",
    "measure_noise_floor": "scoring",
    "objective_names": "scoring",
    "objective_values": "scoring",
    "Score": "scoring",
    "score": "scoring",
    "stability_metrics": "scoring",
    "verdict": "scoring",
    "verdict_line": "scoring",
    "finished_count": "summary", "finished_in": "summary", "study_metrics": "summary",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
