"""No inert searches (issue 53, item 4).

The quickstart searched ``amax_history_len`` beside ``amax_compute_algo: most_recent``, which reads only the
newest amax: trials 2 and 12 differed only in the history, scored the same and both sat on the front. A space
that searches a setting another setting makes inert is refused, naming both fields and their values.
"""

from __future__ import annotations

import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.checks import check_space
from precsearch.config.inert import PRECISIONS, RULES, knob_at
from precsearch.config.loader import parse_space
from precsearch.errors import UserError

ONLY_CURRENT = [{"name": "all", "modules": ["*"], "precision": {"choices": ["bf16", "fp8_current"]}}]
ONLY_BF16_NVFP4 = [{"name": "all", "modules": ["*"], "precision": {"choices": ["bf16", "nvfp4"]}}]
ONLY_BF16 = [{"name": "all", "modules": ["*"], "precision": "bf16"}]


def _refusal(**overrides) -> str:
    space = parse_space(tiny_space_dict(**overrides))
    with pytest.raises(UserError) as caught:
        check_space(space, file="space.yaml")
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    return message


@pytest.mark.parametrize("overrides, fragments", [
    ({"search.recipe.amax_history_len": {"choices": [16, 1024]}, "search.recipe.amax_compute_algo": "most_recent"},
     ["search.recipe.amax_history_len: searched as {choices: [16, 1024]}",
      "search.recipe.amax_compute_algo is most_recent", "does nothing"]),
    ({"search.recipe.amax_compute_algo": {"choices": ["max", "most_recent"]}, "search.recipe.amax_history_len": 1},
     ["search.recipe.amax_compute_algo: searched as {choices: [max, most_recent]}",
      "search.recipe.amax_history_len is 1", "does nothing"]),
    ({"search.recipe.amax_history_len": {"choices": [16, 1024]},
      "search.recipe.amax_compute_algo": {"choices": ["max", "most_recent"]}},
     ["search.recipe.amax_history_len: searched as {choices: [16, 1024]}",
      "beside search.recipe.amax_compute_algo {choices: [max, most_recent]}", "under most_recent",
      "fix search.recipe.amax_compute_algo: max and include 1"]),
    ({"search.recipe.margin": {"choices": [0, 1]}, "search.groups": ONLY_CURRENT},
     ["search.recipe.margin: searched as {choices: [0, 1]}", "no layer can run fp8_delayed",
      "search.groups, search.units and search.default_precision offer bf16, fp8_current"]),
    ({"search.recipe.amax_history_len": {"low": 1, "high": 64}, "search.groups": ONLY_CURRENT},
     ["search.recipe.amax_history_len: searched as {low: 1, high: 64, log: false}", "fp8_delayed"]),
    ({"search.recipe.nvfp4_rht": {"choices": [True, False]}},
     ["search.recipe.nvfp4_rht: searched as {choices: [true, false]}", "no layer can run nvfp4",
      "offer bf16, fp8_block, fp8_current, fp8_delayed"]),
    ({"search.recipe.fp8_format": {"choices": ["hybrid", "e4m3"]}, "search.groups": ONLY_BF16_NVFP4},
     ["search.recipe.fp8_format: searched as {choices: [hybrid, e4m3]}",
      "no layer can run fp8_block or fp8_current or fp8_delayed or mxfp8", "offer bf16, nvfp4"]),
    ({"search.warmup_steps": {"choices": [0, 4]}, "search.groups": ONLY_BF16},
     ["search.warmup_steps: searched as {choices: [0, 4]}", "offer bf16"]),
], ids=["history_under_most_recent", "algo_over_one_amax", "both_searched", "margin_without_delayed",
        "history_range_without_delayed", "nvfp4_switch_without_nvfp4", "format_without_fp8", "warmup_all_bf16"])
def test_an_inert_search_is_refused_naming_both_fields_and_values(overrides, fragments):
    message = _refusal(**overrides)
    assert message.startswith("space.yaml: search.")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_validate_exits_2_with_the_one_line(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(**{"search.recipe.amax_history_len": {"choices": [1, 16, 1024]},
                                                    "search.recipe.amax_compute_algo": "most_recent"}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: search.recipe.amax_history_len" in err and "most_recent" in err and "Traceback" not in err


@pytest.mark.parametrize("overrides", [
    {"search.recipe.amax_history_len": {"choices": [1, 16, 1024]}},  # max, and fp8_delayed among the choices
    {"search.recipe.amax_compute_algo": {"choices": ["max", "most_recent"]}, "search.recipe.amax_history_len": 16},
    {"search.recipe.amax_history_len": 16, "search.recipe.amax_compute_algo": "most_recent",
     "search.groups": ONLY_CURRENT},  # inert, but fixed: no trial is spent on it
    {"search.recipe.nvfp4_rht": {"choices": [True, False]}, "search.units": [{"precision": {"choices":
                                                                                           ["bf16", "nvfp4"]}}],
     "search.groups": [], "search.allow_unsoaked": True},  # a per-module unit can run NVFP4: read there
], ids=["history_under_max", "algo_over_16", "fixed_inert_values", "nvfp4_in_units"])
def test_a_setting_some_trial_reads_is_accepted(overrides, unsoaked_nvfp4):  # NVFP4 unsoaked, not refused
    check_space(parse_space(tiny_space_dict(**{"search.warmup_steps": 0, **overrides})), file="space.yaml")


def test_every_rule_names_a_real_setting_and_a_real_cause():
    """A rule naming a field the space does not have would never fire (or crash every validate)."""
    space = parse_space(tiny_space_dict())
    for rule in RULES:
        knob_at(space, rule.setting)
        if rule.by != PRECISIONS:
            knob_at(space, rule.by)


def test_a_warm_up_the_fixed_state_reading_reads_past_is_refused_naming_the_states():
    """The reading turns low precision on at a state past the policy's warm-up: with every state (here step 12
    of 12) past the longest warm-up (4), warm-ups 0 and 4 read alike (the 8B space's pairs of equal trials)."""
    message = _refusal(**{"objectives.reading": "damage", "objectives.reference_seeds": 1,
                          "objectives.damage.states": [1.0], "search.warmup_steps": {"choices": [0, 4]}})
    for fragment in ["space.yaml: search.warmup_steps: searched as [0, 4]", "objectives.damage.states [1]",
                     "at steps [12]", "past the longest warm-up (4)", "a fraction below 0.333333"]:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_a_state_inside_the_warm_up_lets_the_reading_see_it():
    check_space(parse_space(tiny_space_dict(**{
        "objectives.reading": "damage", "objectives.reference_seeds": 1, "objectives.damage.states": [0.0, 1.0],
        "search.warmup_steps": {"choices": [0, 4]}})), file="space.yaml")


def test_histories_the_fixed_state_reading_cannot_tell_apart_are_warned_about_naming_the_passes(tmp_path, capsys):
    """The quickstart (AMD EPYC, 2026-12-07) spent trials 6 and 8 on one policy but for an amax history of 16 or
    1024: both read 2.95e-05, as the fixed-state reading quantizes 6 passes a state from fresh scalers. The
    probe's training does see the history, so the space is not refused: ``validate`` says which values read
    alike and why, and a history below the passes (1) is its own reading."""
    from precsearch.config.inert import reading_warnings

    damage = {"objectives.reading": "damage", "objectives.reference_seeds": 1, "search.warmup_steps": 0}
    alike = parse_space(tiny_space_dict(**damage, **{"search.recipe.amax_history_len": {"choices": [1, 16, 1024]}}))
    (warning,) = reading_warnings(alike)
    assert "16, 1024 read alike" in warning and "6 passes a state" in warning
    assert "objectives.damage.warm_batches + batches" in warning
    apart = {"search.recipe.amax_history_len": {"choices": [1, 1024]}}
    assert reading_warnings(parse_space(tiny_space_dict(**damage, **apart))) == []
    more = {"objectives.damage.warm_batches": 20, "search.recipe.amax_history_len": {"choices": [1, 16, 1024]}}
    assert reading_warnings(parse_space(tiny_space_dict(**damage, **more))) == []  # 16 < 24 passes: read apart
    final = {"objectives.reading": "final", "search.recipe.amax_history_len": {"choices": [16, 1024]}}
    assert reading_warnings(parse_space(tiny_space_dict(**final))) == []  # the probe's own run: history carries
    path = write_space(tmp_path, tiny_space_dict(**damage, **{"search.recipe.amax_history_len":
                                                             {"choices": [16, 1024]}}))
    assert main(["validate", str(path)]) == 0
    assert "warning: search.recipe.amax_history_len {choices: [16, 1024]}: 16, 1024 read alike" in \
        capsys.readouterr().err
