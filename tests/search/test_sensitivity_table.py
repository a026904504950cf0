"""The sensitivity table's memory column adds up to the memory model's figure for whole policies, and its reports."""

from __future__ import annotations

import random

import pytest

from _spaces import tiny_space_dict
from precsearch.config.loader import parse_space
from precsearch.config.unit_space import searched_units
from precsearch.precision import Precision
from precsearch.probe.memory.peak import predict_peak
from precsearch.search.sampling import policy_from_params
from precsearch.search.sensitivity import SensitivityTable, UnitEffect, memory_basis, memory_effect, predict
from precsearch.tracking.sensitivity_report import sensitivity_artifacts, table_csv


def _space():
    data = tiny_space_dict(**{"model.n_layers": 3, "search.warmup_steps": 0,
                              "search.units": [{"precision": {"choices": ["bf16", "fp8_current", "fp8_block"]}},
                                               {"modules": ["output_layer"],
                                                "precision": {"choices": ["bf16", "fp8_current"]}}]})
    data["search"].pop("groups")
    return parse_space(data)


@pytest.mark.parametrize("seed", range(4))
def test_unit_memory_effects_add_up_to_the_policy_prediction(seed):
    """The integer program sums per-unit savings; if the memory model were not additive here its
    budgets would be wrong (the candidates' predicted memory would not be what the trial measures)."""
    space = _space()
    units = searched_units(space.search.units, 3)
    rng = random.Random(seed)
    params = {u.param: rng.choice([p.value for p in u.knob.options()]) for u in units}
    rows = [UnitEffect(u.unit, u.param, params[u.param], 0.0, 0.0,
                       memory_effect(space, u.unit, Precision(params[u.param])) if params[u.param] != "bf16" else 0.0,
                       0.0) for u in units]
    _, summed, _ = predict(SensitivityTable("forward", rows, 0.0), params)
    cfg = memory_basis(space)
    policy = policy_from_params(space, params)
    precisions = {n: r.precision for n, r in policy.layer_recipes(
        [u.unit for u in units], cfg.n_layers).items()}
    kwargs = dict(seq_len=space.probe.seq_len, micro_batch=space.probe.micro_batch, param_dtype="fp32")
    whole = 1 - predict_peak(cfg, precisions, **kwargs).total / predict_peak(cfg, {}, **kwargs).total
    assert summed == pytest.approx(whole, rel=1e-9, abs=1e-12)


def test_reports_have_a_row_per_effect_and_a_png_heatmap():
    rows = [{"unit": f"decoder.layers.{b}.mlp.linear_fc1", "param": f"precision.L{b}.linear_fc1", "precision": p,
             "predicted_instability": 0.001 * b, "raw_score": 0.0, "memory_saved": 0.01, "speed_gain": 0.0}
            for b in range(3) for p in ("bf16", "fp8_current")]
    rows.append(rows[0] | {"unit": "output_layer", "param": "precision.output_layer", "precision": "fp8_current"})
    files = sensitivity_artifacts({"estimator": "forward", "rows": rows})
    assert set(files) == {"sensitivity/table.json", "sensitivity/table.csv", "sensitivity/heatmap.png"}
    assert files["sensitivity/heatmap.png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert table_csv(rows).count("\n") == len(rows) + 1


def test_predicted_speed_uses_each_formats_nominal_rate():
    """NVFP4's GEMM runs at twice FP8's nominal rate, so it saves 3/4 of a unit's GEMM time, FP8 1/2."""
    from precsearch.search.sensitivity import speed_effect

    cfg = parse_space(tiny_space_dict()).model.probe()
    unit = "decoder.layers.0.mlp.linear_fc1"
    fp8, mxfp8, nvfp4 = (speed_effect(cfg, unit, p) for p in (Precision.FP8_CURRENT, Precision.MXFP8,
                                                               Precision.NVFP4))
    assert speed_effect(cfg, unit, Precision.BF16) == 0.0
    assert 0 < fp8 == mxfp8 < nvfp4 == pytest.approx(1.5 * fp8)
