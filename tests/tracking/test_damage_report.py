"""The damage reading's MLflow table names what its figure is in, for every figure a space can choose."""

from __future__ import annotations

import typing

import pytest

from precsearch.config.damage_section import DamageMeasure
from precsearch.probe.damage import MEASURES
from precsearch.tracking.damage_report import damage_table


def _reading(measure: str) -> dict:
    figures = {m: [0.5, 0.1] for m in MEASURES}
    state = {"step": 20, "total": figures, "units": {"decoder.layers.0.mlp.linear_fc1": figures}}
    return {"measure": measure, "value": 0.5, "se": 0.1, "state_step": 20, "tokens_per_step": 4096,
            "states": [state]}


def test_every_measure_a_space_can_name_is_a_figure_of_the_reading():
    assert set(typing.get_args(DamageMeasure)) == set(MEASURES)


@pytest.mark.parametrize("measure", MEASURES)
def test_the_table_says_what_its_figure_is_in(measure):
    table = damage_table(_reading(measure))
    assert table.startswith(f"# Fixed-state damage: {measure}")
    assert "| **total** | 0.5 ± 0.1 |" in table and "| decoder.layers.0.mlp.linear_fc1 | 0.5 ± 0.1 |" in table
    noise_units = measure in ("grad_noise", "grad_bias_noise", "update_noise")
    assert ("4,096 tokens per step" in table) == noise_units
    assert ("squared norm" in table) == measure.endswith("_norm")
