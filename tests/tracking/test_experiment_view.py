"""The MLflow runs table's columns follow what the study measured: no seed-noise column without a noise floor."""

from __future__ import annotations

import json

from precsearch.tracking.experiment_view import VIEW_KEY, VIEW_PREFIX, experiment_tags, metric_columns


def test_gap_in_noise_is_a_column_only_where_the_study_has_a_noise_floor():
    assert metric_columns("relative")[-1] == "gap_in_noise"
    # one BF16 reference seed (the damage spaces): the column would be empty in every row, cutting the others
    assert "gap_in_noise" not in metric_columns("damage", noise=False)
    assert metric_columns("damage", noise=False)[:2] == ("memory_saved_pct", "instability_in_unit")


def test_the_shared_view_leaves_the_empty_column_out():
    tags = experiment_tags(["precision.mlp"], "damage", noise=False)
    view = json.loads(tags[VIEW_PREFIX + VIEW_KEY])
    assert "metrics.`gap_in_noise`" not in view["selectedColumns"]
    assert "params.`precision.mlp`" in view["selectedColumns"]
    with_noise = json.loads(experiment_tags(["precision.mlp"], "noise")[VIEW_PREFIX + VIEW_KEY])
    assert "metrics.`gap_in_noise`" in with_noise["selectedColumns"]


def test_the_multiple_of_the_standard_recipe_sits_beside_the_instability_where_the_study_read_it():
    from precsearch.tracking.experiment_view import VS_STANDARD

    assert metric_columns("damage", noise=False, standard=True)[:3] == (
        "memory_saved_pct", "instability_in_unit", VS_STANDARD)
    assert VS_STANDARD not in metric_columns("damage", noise=False)
    view = json.loads(experiment_tags(["precision.mlp"], "damage", noise=False, standard=True)[
        "mlflow.sharedViewState.precsearch"])
    assert "metrics.`instability_vs_standard`" in view["selectedColumns"]
