"""Per-module units in a space file: parsing, errors that name the field, and the policy a trial builds."""

from __future__ import annotations

import optuna
import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.config.checks import check_space
from precsearch.runtime.preflight import preflight
from precsearch.config.loader import load_space, parse_space
from precsearch.config.unit_space import parse_blocks, searched_units
from precsearch.errors import UserError
from precsearch.precision import Precision
from precsearch.search.sampling import policy_from_params, suggest_policy

P = Precision
CHOICES = {"choices": ["bf16", "fp8_current", "fp8_block"]}


def _space(units, **extra):
    data = tiny_space_dict(**{"search.units": units, "model.n_layers": 4, "search.warmup_steps": 0}, **extra)
    data["search"].pop("groups")
    return parse_space(data, file="s.yaml")


def test_block_ranges_parse_inclusively():
    assert parse_blocks([0, "2-4", " 6 - 6 "]) == [0, 2, 3, 4, 6]
    for bad, words in (("4-2", "backwards"), ("two", "neither"), (-1, "negative")):
        with pytest.raises(ValueError, match=words):
            parse_blocks([bad])


def test_every_unit_of_the_selected_blocks_gets_its_own_param():
    space = _space([{"blocks": ["1-2"], "modules": ["linear_qkv", "linear_fc2"], "precision": CHOICES},
                    {"modules": ["output_layer"], "precision": CHOICES}])
    units = searched_units(space.search.units, 4)
    assert [u.param for u in units] == ["precision.L1.linear_qkv", "precision.L2.linear_qkv",
                                        "precision.L1.linear_fc2", "precision.L2.linear_fc2",
                                        "precision.output_layer"]
    assert units[0].unit == "decoder.layers.1.self_attention.linear_qkv"


def test_a_trial_policy_gives_each_unit_exactly_its_param():
    """Each unit runs the precision of its own param; units not listed keep the default."""
    space = _space([{"modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "precision": CHOICES},
                    {"modules": ["output_layer"], "precision": CHOICES}])
    units = searched_units(space.search.units, 4)
    params = {u.param: ["bf16", "fp8_current", "fp8_block"][i % 3] for i, u in enumerate(units)}
    policy = policy_from_params(space, params)
    for u in units:
        assert policy.precision_for(u.unit, 4).value == params[u.param]
    # the Hugging Face names of a fused unit follow it (q/k/v of linear_qkv)
    assert policy.precision_for("model.layers.3.self_attn.k_proj", 4).value == params["precision.L3.linear_qkv"]
    trial = optuna.create_study().ask()
    suggest_policy(space, trial)
    assert set(trial.params) == set(params)


def test_unit_rules_come_before_groups():
    data = tiny_space_dict(**{"search.units": [{"blocks": [0], "modules": ["linear_fc1"],
                                                "precision": {"choices": ["bf16"]}}], "search.warmup_steps": 0})
    data["search"]["groups"] = [{"name": "mlp", "modules": ["*.mlp.*"], "precision": "fp8_current"}]
    space = parse_space(data)
    policy = policy_from_params(space, {"precision.L0.linear_fc1": "bf16"})
    assert policy.precision_for("decoder.layers.0.mlp.linear_fc1", 2) is P.BF16
    assert policy.precision_for("decoder.layers.1.mlp.linear_fc1", 2) is P.FP8_CURRENT


@pytest.mark.parametrize(("units", "field", "words"), [
    ([{"blocks": [5], "precision": CHOICES}], "search.units[0].blocks", "past the probe's 4 blocks"),
    ([{"blocks": ["0-1", 1], "precision": CHOICES}], "search.units[0].blocks", "selected twice"),
    ([{"blocks": [0], "precision": CHOICES}, {"blocks": [0], "modules": ["linear_fc1"], "precision": CHOICES}],
     "search.units[1].modules", r"already in search\.units\[0\]"),
])
def test_unit_errors_name_the_field(tmp_path, units, field, words):
    space = _space(units)
    with pytest.raises(UserError, match=words) as exc:
        check_space(space, file="s.yaml")
    assert exc.value.field == field


def test_parse_errors_name_the_field(tmp_path):
    data = tiny_space_dict(**{"search.units": [{"modules": ["linear_q"], "precision": CHOICES}]})
    with pytest.raises(UserError, match=r"search\.units\.0\.modules|search\.units\[0\]\.modules"):
        load_space(write_space(tmp_path, data))
    data = tiny_space_dict(**{"search.units": [{"blocks": ["1-x"], "precision": CHOICES}]})
    with pytest.raises(UserError, match="neither a block index nor a range"):
        load_space(write_space(tmp_path, data))


def test_sensitivity_needs_searched_units():
    data = tiny_space_dict(**{"search.sensitivity": {"budgets": 4}})
    with pytest.raises(UserError, match="search.units has none") as exc:
        check_space(parse_space(data), file="s.yaml")
    assert exc.value.field == "search.sensitivity"


def test_emulated_backend_takes_nvfp4_units(unsoaked_nvfp4):
    """NVFP4 is emulated (issue 19), so per-module units may choose it, with the sensitivity pass too."""
    # the soak refuses NVFP4 (tests/config/test_soak_checks.py); taken as unsoaked here, the space opts in
    space = _space([{"modules": ["linear_fc2"], "precision": {"choices": ["bf16", "nvfp4"]}}],
                   **{"search.allow_unsoaked": True})
    check_space(space, file="s.yaml")
    preflight(space, file="s.yaml")
    base = {"search.units": [{"modules": ["linear_fc2"], "precision": {"choices": ["bf16", "nvfp4"]}}],
            "search.sensitivity": {}, "search.allow_unsoaked": True}
    check_space(parse_space(tiny_space_dict(**base)), file="s.yaml")
    units = searched_units(space.search.units, 4)
    unit = units[0]
    assert unit.knob.options() == [P.BF16, P.NVFP4]
    policy = policy_from_params(space, {u.param: "nvfp4" if u is unit else "bf16" for u in units})
    assert [r.precision for r in policy.rules if r.name == unit.rule_name] == [P.NVFP4]


def test_a_precision_range_is_refused_naming_the_set():
    """Precisions are categorical: the loader refuses a range and names the field (no later check needed)."""
    with pytest.raises(UserError, match="not a range") as exc:
        _space([{"precision": {"low": "bf16", "high": "fp8_current"}}])
    assert "search.units[0].precision" in str(exc.value)


def test_sensitivity_refuses_what_it_cannot_score_or_trade():
    speed = {"search.units": [{"precision": {"choices": ["bf16", "fp8_current"]}}],
             "search.sensitivity": {"budget_on": "speed"}}
    with pytest.raises(UserError, match="enable objectives.throughput") as exc:
        check_space(parse_space(tiny_space_dict(**speed)), file="s.yaml")
    assert exc.value.field == "search.sensitivity.budget_on"
