"""Choosing a trial, format dispatch, writing files, and export() against a small Optuna study."""

from __future__ import annotations

import math

import optuna
import pytest

from _spaces import tiny_space_dict
from precsearch.config.loader import parse_space
from precsearch.errors import UserError
from precsearch.export.pick import choose_trial
from precsearch.export.registry import render
from precsearch.arch.units import hf_linear_names
from precsearch.export.format_output import block_ranges, layer_table
from precsearch.export.policy_export import write_export
from precsearch.runtime.study_export import export, export_trial
from precsearch.policy import Policy, Rule
from precsearch.policy.file import load_policy_file
from precsearch.precision import Precision
from precsearch.runtime.workspace import Workspace

P = Precision


def _row(trial, mem, inst, tps, feasible=True, pareto=True, diverged=False):
    return {"trial": trial, "memory_saved": mem, "instability": inst, "tokens_per_s": tps,
            "feasible": feasible, "pareto": pareto, "diverged": diverged, "loss_gap": inst}


ROWS = [
    _row(0, 0.30, 0.010, 900),
    _row(1, 0.25, 0.004, 1300),
    _row(2, 0.25, 0.002, 800),
    _row(3, 0.40, 0.200, 5000, feasible=False, pareto=False),  # unstable: never a candidate
    _row(4, 0.10, 0.001, 1200),
    _row(5, 0.50, 1.0, 9000, feasible=False, pareto=False, diverged=True),
    _row(6, 0.05, 0.003, 1500, pareto=False),  # fast but dominated: not on the front
    _row(7, 0.30, 0.010, 700),  # ties trial 0 on memory and instability: the lower number wins
]


@pytest.mark.parametrize(("pick", "limit", "trial"), [
    ("max-memory", None, 0),
    ("max-memory", 0.005, 2),  # 1 and 2 save the same: the more stable wins
    ("max-memory", 0.001, 4),
    ("fastest", None, 1),  # trial 6 is faster but off the front
    ("fastest", 0.003, 4),
    ("most-stable", None, 4),
    ("most-stable", 0.5, 4),
])
def test_choose_trial_rules(pick, limit, trial):
    row, reason = choose_trial(ROWS, pick, limit)
    assert row["trial"] == trial
    assert reason.startswith(f"trial {trial} ")
    if limit is not None:
        assert f"instability <= {limit:g}" in reason


def test_choose_trial_explains_the_choice():
    _, reason = choose_trial(ROWS, "max-memory", 0.005)
    assert reason == ("trial 2 saves the most memory of 4 feasible trials with instability <= 0.005 fraction of "
                      "the BF16 loss (memory saved 25.00%, instability 0.002 fraction of the BF16 loss, 800 tokens/s)")


def test_max_instability_is_in_the_study_unit_seed_spreads_for_a_noise_study():
    """In a study measured in seed spreads, --max-instability was still a fraction of the loss: 1.0 (one
    spread) let every trial through and 0.005 matched none that the user meant."""
    rows = [dict(r, noise_floor=0.005) for r in ROWS]  # trial 1: 0.004 / 0.005 = 0.8 spreads; trial 0: 2.0
    row, reason = choose_trial(rows, "max-memory", 1.0, unit="noise")
    assert row["trial"] == 2 and "instability <= 1 BF16 seed spreads" in reason and "0.4 BF16 seed spreads" in reason
    assert choose_trial(rows, "max-memory", 2.0, unit="noise")[0]["trial"] == 0
    with pytest.raises(UserError, match=r"<= 0.1 BF16 seed spreads \(the study's unit\); the lowest is 0.2 \(trial 4\)"):
        choose_trial(rows, "max-memory", 0.1, unit="noise")


def test_choose_trial_refusals():
    with pytest.raises(UserError, match="valid: max-memory, fastest, most-stable"):
        choose_trial(ROWS, "cheapest")
    with pytest.raises(UserError, match="must be >= 0"):
        choose_trial(ROWS, "max-memory", -1)
    with pytest.raises(UserError, match=r"instability <= 0.0001 fraction of the BF16 loss \(the study's unit\); the lowest is 0.001 \(trial 4\)"):
        choose_trial(ROWS, "max-memory", 0.0001)
    with pytest.raises(UserError, match="no feasible finished trial among 2"):
        choose_trial([r for r in ROWS if not r["feasible"]], "most-stable")
    nan_row = _row(9, math.nan, math.nan, 1)
    with pytest.raises(UserError, match="no feasible"):
        choose_trial([nan_row], "max-memory")


def test_layer_table_and_helpers():
    names = hf_linear_names(2)
    assert names[:4] == [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"]
    assert names[-1] == "lm_head" and len(names) == 2 * 7 + 1
    policy = Policy(rules=(Rule("attn", ("*.self_attn.*",), P.FP8_CURRENT, last=1),))
    table = layer_table(policy, 2)
    assert table["model.layers.1.self_attn.k_proj"] is P.FP8_CURRENT
    assert table["model.layers.0.self_attn.k_proj"] is P.BF16
    assert block_ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8" and block_ranges([]) == ""


def test_render_policy_format_and_unknown_format(tmp_path):
    policy = Policy(rules=(Rule("mlp", ("*.mlp.*",), P.FP8_BLOCK),), warmup_steps=2)
    out = render("policy", policy, 4, {"trial": 3})
    (tmp_path / "policy.yaml").write_text(out.files["policy.yaml"])
    assert load_policy_file(tmp_path / "policy.yaml") == (policy, {"trial": 3}) and out.warnings == []
    with pytest.raises(UserError, match="valid: policy, megatron, torchtitan, accelerate"):
        render("deepspeed", policy, 4)
    with pytest.raises(UserError, match="at least 1"):
        render("megatron", policy, 0)


def test_write_export_file_or_directory(tmp_path):
    assert write_export({"a.yaml": "x"}, None) == []
    assert write_export({"a.yaml": "x"}, tmp_path / "sub" / "p.yaml") == [tmp_path / "sub" / "p.yaml"]
    assert (tmp_path / "sub" / "p.yaml").read_text() == "x"
    assert write_export({"a.yaml": "y"}, tmp_path / "sub") == [tmp_path / "sub" / "a.yaml"]  # existing dir
    written = write_export({"a.sh": "1", "b.yaml": "2"}, tmp_path / "megatron")
    assert [p.name for p in written] == ["a.sh", "b.yaml"] and (tmp_path / "megatron" / "b.yaml").read_text() == "2"
    with pytest.raises(UserError, match="give a directory"):
        write_export({"a.sh": "1", "b.yaml": "2"}, tmp_path / "sub" / "p.yaml")


# ---- export() on a study --------------------------------------------------------------------

POLICIES = {
    0: Policy(rules=(Rule("all", ("model.*",), P.FP8_CURRENT),), clip_grad=1.0),
    1: Policy(rules=(Rule("attn", ("*.self_attn.*",), P.FP8_CURRENT),), clip_grad=1.0),
    2: Policy(clip_grad=1.0),
}
SCORES = {0: (0.30, 0.020), 1: (0.15, 0.003), 2: (0.0, 0.0)}


@pytest.fixture
def study():
    space = parse_space(tiny_space_dict()).model_dump(mode="json")
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("objectives", ["memory_saved", "instability"])
    study.set_user_attr("space", space)
    for number, policy in POLICIES.items():
        mem, inst = SCORES[number]
        score = {"memory_saved": mem, "instability": inst, "loss_gap": inst, "tokens_per_s": 100.0 + number,
                 "feasible": inst <= 0.05, "diverged": False}
        study.add_trial(optuna.trial.create_trial(values=[mem, inst], params={}, distributions={},
                                                  user_attrs={"policy": policy.to_dict(), "score": score}))
    return study


WS = Workspace(output_dir=None, study_name="fake", storage_url="", tracking_uri="", experiment="")


def test_export_by_number_matches_export_trial(study):
    result = export(study, WS, trial=1)
    assert result.trial == 1 and result.reason == "trial 1 (asked for by number)"
    assert result.files == {"policy.yaml": export_trial(study, WS, 1)}


def test_export_by_rule_records_why_in_the_provenance(study, tmp_path):
    result = export(study, WS, pick="max-memory", max_instability=0.005)
    assert result.trial == 1 and "saves the most memory" in result.reason
    (tmp_path / "p.yaml").write_text(result.files["policy.yaml"])
    policy, provenance = load_policy_file(tmp_path / "p.yaml")
    assert policy == POLICIES[1]
    assert provenance["chosen_by"] == {"pick": "max-memory", "max_instability": 0.005, "reason": result.reason,
                                       "max_instability_unit": "fraction of the BF16 loss", "margin": 0.1}
    # trial 0 is past 90% of the tiny space's 0.01 limit: the default margin passes it over, --margin 0 takes it
    assert export(study, WS, pick="max-memory").trial == 1
    assert export(study, WS, pick="max-memory", margin=0).trial == 0


def test_export_formats_use_the_target_depth(study):
    result = export(study, WS, trial=0, fmt="megatron")  # the tiny space's target has 2 blocks
    assert "for a 2-layer Llama 3" in result.files["megatron_args.sh"]
    result = export(study, WS, trial=0, fmt="megatron", n_layers=32)
    assert "for a 32-layer Llama 3" in result.files["megatron_args.sh"]


def test_export_argument_refusals(study):
    with pytest.raises(UserError, match="either a trial number or a rule"):
        export(study, WS)
    with pytest.raises(UserError, match="either a trial number or a rule"):
        export(study, WS, trial=1, pick="fastest")
    with pytest.raises(UserError, match="only applies with --pick"):
        export(study, WS, trial=1, max_instability=0.1)
    with pytest.raises(UserError, match="no trial 9"):
        export(study, WS, trial=9)
