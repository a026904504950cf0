"""What the MLflow UI shows when it opens a study's experiment, preset from the tracking side.

Read from MLflow 3.17's UI bundle (``mlflow/server/js/build``), not documented by MLflow:

* **Mode.** The experiment tag ``mlflow.experimentKind`` (``custom_model_development`` or
  ``genai_development``) picked the mode in earlier 3.x UIs. 3.17 reads a per-browser
  "workflow type" instead (local storage ``mlflow.workflowType``, default ``genai``), which the
  URL's ``workflowType=machine_learning`` overrides. precsearch sets the tag and puts the
  parameter in the URL it prints.
* **Columns, order, filter.** By default the runs table shows Source, Models and Dataset, and
  no metric or parameter. A *shared view* is an experiment tag
  ``mlflow.sharedViewState.<key>`` holding JSON with search facets (``searchFilter``,
  ``orderByKey``, ``orderByAsc``, ...) and UI state (``selectedColumns``, ``runsHiddenMode``,
  ...); the URL parameter ``viewStateShareKey=<key>`` applies it. ``runsExpanded`` is not
  shareable, so nested runs would open collapsed: trials are top-level runs (see
  :mod:`precsearch.tracking.mlflow_tracker`).
"""

from __future__ import annotations

import json

from precsearch.tracking.review_columns import MEMORY_PCT, SORT_KEY, instability_column

KIND_TAG = "mlflow.experimentKind"
KIND = "custom_model_development"
VIEW_PREFIX = "mlflow.sharedViewState."
VIEW_KEY = "precsearch"
FRONT_KEY = "precsearch-front"
FRONT_FILTER = "tags.pareto = 'true'"

SECTION = "precsearch-tradeoff"
#: Trial tags shown as columns, first: MLflow's Assistant panel covers the right of the table.
TAG_COLUMNS = ("feasible", "pareto")


#: The trial metric of the instability as a multiple of the standard FP8 recipe's (the fixed-state reading's).
VS_STANDARD = "instability_vs_standard"


def metric_columns(unit: str = "relative", noise: bool = True, standard: bool = False) -> tuple[str, ...]:
    """Trial metrics shown as columns, in order: the objectives in percent (or seed spreads), as the terminal
    prints them (:mod:`precsearch.tracking.review_columns`), the instability as a multiple of the standard FP8
    recipe's beside it where the study read that recipe (``standard``), then, where the study has a noise floor
    (``noise``: 2 or more BF16 reference seeds), the loss gap in seed spreads; without them those columns would
    be empty in every row."""
    return ((MEMORY_PCT, instability_column(unit)) + ((VS_STANDARD,) if standard else ()) + ("tokens_per_s",)
            + (("gap_in_noise",) if noise else ()))


def charts(unit: str = "relative") -> tuple[tuple[str, str], ...]:
    """Scatter charts (x, y) of the chart view, in a section of their own."""
    return ((MEMORY_PCT, instability_column(unit)), (MEMORY_PCT, "tokens_per_s"))


def column(kind: str, name: str) -> str:
    """A runs-table column key as the MLflow UI writes it: ``metrics.`memory_saved```."""
    return f"{kind}.`{name}`"


def view_state(param_names: list[str], search_filter: str = "", unit: str = "relative", noise: bool = True,
               standard: bool = False) -> dict:
    """A shared view: feasible trials first by memory saved; front and feasible flags, objectives and params as
    columns; two large scatters, one to a row (MLflow's default, three small ones to a row, listed 3 of 13 runs in
    a legend of two lines)."""
    columns = ([column("tags", t) for t in TAG_COLUMNS]
               + [column("metrics", m) for m in metric_columns(unit, noise, standard)]
               + [column("params", p) for p in param_names])
    return {
        "searchFilter": search_filter,
        "orderByKey": column("metrics", SORT_KEY),
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "selectedColumns": columns,
        "columnOrder": columns,
        "runsHiddenMode": "SHOW_ALL",
        "compareRunSections": [{"uuid": SECTION, "name": "precsearch trade-off", "display": True,
                                "isReordered": False, "deleted": False, "isGenerated": False,
                                "columns": 1, "cardHeight": 560}],
        "compareRunCharts": [_scatter(x, y) for x, y in charts(unit)],
    }


def _scatter(x: str, y: str) -> dict:
    """A chart view scatter of two metrics over every run shown (MLflow's RunsChartsScatterCardConfig)."""
    return {"uuid": f"precsearch-{x}-{y}", "type": "SCATTER", "runsCountToCompare": 100, "metricSectionId": SECTION,
            "deleted": False, "isGenerated": False, "xaxis": {"key": x, "type": "METRIC"},
            "yaxis": {"key": y, "type": "METRIC"}}


def experiment_tags(param_names: list[str], unit: str = "relative", noise: bool = True,
                    standard: bool = False) -> dict[str, str]:
    """The experiment kind and two shared views: every run, and the front trials only (``noise``, ``standard``:
    see :func:`metric_columns`)."""
    names = sorted(param_names)
    return {KIND_TAG: KIND, VIEW_PREFIX + VIEW_KEY: json.dumps(view_state(names, unit=unit, noise=noise,
                                                                          standard=standard)),
            VIEW_PREFIX + FRONT_KEY: json.dumps(view_state(names, FRONT_FILTER, unit, noise, standard))}


def experiment_url(base_url: str, experiment_id: str, front: bool = False, charts: bool = False) -> str:
    """The experiment's runs in model-training mode on a shared view (``front``: front trials only), as the
    table or (``charts``) the chart view."""
    from urllib.parse import urlencode

    query = {"workflowType": "machine_learning", "viewStateShareKey": FRONT_KEY if front else VIEW_KEY}
    query = urlencode(query | ({"compareRunsMode": "CHART"} if charts else {}))
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def artifact_url(base_url: str, experiment_id: str, run_id: str, path: str) -> str:
    """An artifact of a run in MLflow's artifact viewer, in model-training mode (``path`` as ``front/front.png``;
    an empty path opens the run's Artifacts tab)."""
    return f"{run_url(base_url, experiment_id, run_id, 'artifacts/' + path if path else 'artifacts')}"


def run_url(base_url: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """A run's page (``tab``: ``artifacts/<path>``, ``model-metrics``, ...) in model-training mode: without the
    parameter MLflow 3.17 opens it in the browser's stored mode, GenAI by default."""
    tail = f"/{tab}" if tab else ""
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{tail}?workflowType=machine_learning"
