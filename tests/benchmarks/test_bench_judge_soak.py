"""benchmarks/bench_judge_soak.py: the fixed-state reading judged on the soak's truth (issue 54, item 3).

What would be wrong if these failed: the judge could read the truth's calls wrongly (a NaN or a diverged
combination not counted as harmful), rename the GPU model's weights into the wrong Llama tensors (every GPU
reading then taken at a state no run had), plant the pre-fix arithmetic for good (every later reading with the
old rule) or not at all, or count a harmful case read stable as anything but false-stable.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_judge_soak as js  # noqa: E402
import bench_soak  # noqa: E402
from precsearch.backends import fp8_state_adam  # noqa: E402
from precsearch.probe.model.llama3 import Llama3  # noqa: E402


def _soak_row(call: str, *, diverged: int = 0, non_finite: tuple[int, ...] = ()) -> dict:
    return {"runs": 8, "non_finite": list(non_finite), "diverged": diverged, "gap_pct": 0.5, "se_pct": 0.4,
            "at_tolerance": call, "at_detection_limit": call}


def test_the_truth_calls_non_finite_and_diverged_combinations_harmful_and_adds_the_pre_fix_case(tmp_path):
    """A soak report written here (the shape bench_soak.py writes): diverged or non-finite runs outrank the
    row's own call, combinations the soak did not run say so, and the pre-fix case joins with its record."""
    report = {"tolerance_pct": 0.25, "detection_limit_pct": 2.48, "rows": {
        bench_soak.BASE: _soak_row("benign"),
        "std_rem_fp8": _soak_row("benign", diverged=4),
        "std_none_fp32": _soak_row("undecided", non_finite=(3,)),
        "std_fp32_fp8block": _soak_row("benign")}}
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(report))
    truth = js.soak_truth(path, bench_soak.Setup.steps)
    cases = truth["cases"]
    assert truth["detection_limit_pct"] == 2.48 and truth["tolerance_pct"] == 0.25
    assert cases["std_rem_fp8"]["at_limit"] == cases["std_rem_fp8"]["at_tolerance"] == "damaging"
    assert cases["std_none_fp32"]["at_limit"] == "non-finite"
    assert cases["std_fp32_fp8block"]["at_limit"] == "benign"
    assert cases[js.PRE_FIX]["at_limit"] == "non-finite"
    assert cases["std_fp32_fp8"]["at_limit"] == "not run"
    assert not set(bench_soak.BASES) & set(cases)


def test_reference_te_names_map_onto_every_llama_tensor_once():
    s = bench_soak.setup(2000)
    cfg = bench_soak.model_config(s)
    te = ["embed.weight", "norm.weight", "head.weight"] + [
        f"layers.{i}.{n}" for i in range(s.layers) for n in (
            "self_attention.layernorm_qkv.layer_norm_weight", "self_attention.layernorm_qkv.weight",
            "self_attention.proj.weight", "layernorm_mlp.layer_norm_weight", "layernorm_mlp.fc1_weight",
            "layernorm_mlp.fc2_weight")]
    with torch.device("meta"):
        want = set(Llama3(cfg).state_dict())
    mapped = [js.llama_name(n, smoke=False) for n in te]
    assert len(set(mapped)) == len(mapped) and set(mapped) == want


def test_pre_fix_arithmetic_is_planted_only_while_its_reading_runs():
    fixed = fp8_state_adam.MIN_AMAX
    block = torch.zeros(fp8_state_adam.QBLOCK)
    block[1::2] = 1e-40  # a starved block: tiny values and zero codes
    with js.pre_fix_arithmetic(True):
        codes, scale_inv = fp8_state_adam.quantize_state(block, "fp8_block")
        assert not torch.isfinite(fp8_state_adam.dequantize_state(codes, scale_inv, "fp8_block")).all()
    assert fp8_state_adam.MIN_AMAX == fixed
    codes, scale_inv = fp8_state_adam.quantize_state(block, "fp8_block")
    assert torch.isfinite(fp8_state_adam.dequantize_state(codes, scale_inv, "fp8_block")).all()


def test_a_harmful_case_stable_at_every_state_of_a_group_is_false_stable():
    truth = {"cases": {"a": {"at_limit": "damaging"}, "b": {"at_limit": "benign"}, "c": {"at_limit": "undecided"}}}
    cases = {n: js.Case(js.Policy(), truth=n) for n in "abc"}

    def cell(call):
        return {"main": {"call": call, "value": 1.0, "limit": 0.01}, "figures": {}}

    readings = {"a": {"p": cell("stable"), "l": cell("unstable")}, "b": {"p": cell("stable"), "l": cell("stable")},
                "c": {"p": cell("unstable"), "l": cell("unstable")}}
    j = js.judge(truth, readings, cases, {"probe": ["p"], "late": ["l"], "all": ["p", "l"]}, "at_limit")
    assert j["probe"]["false_stable"] == ["a"] and j["late"]["false_stable"] == [] == j["all"]["false_stable"]
    assert j["all"]["decided"] == ["a", "b"] and j["all"]["false_unstable"] == []


def test_smoke_reads_every_case_at_every_state_and_sees_the_planted_pre_fix_nan(tmp_path):
    assert js.main(["--smoke", "--out", str(tmp_path), "--planted-bits", "0"]) == 0
    report = json.loads(next(tmp_path.glob("*_bench_judge_soak_smoke.json")).read_text())
    labels = list(report["states"])
    assert labels[0].startswith("probe") and len(labels) == 5
    assert [s["step"] for s in report["states"].values()] == [10, 50, 100, 150, 190]
    assert abs(report["layout"]["relative_difference"]) < 0.01  # the smoke's Llama is the trained model itself
    expected = {n for n in bench_soak.COMBOS if n not in bench_soak.BASES} | {js.PRE_FIX, js.PLANTED.format(0)}
    assert set(report["readings"]) == expected
    for name in ("std_rem_fp8", "std_none_fp32", "std_fp32_fp8block", js.PRE_FIX, "fp8_current"):
        for label in labels:
            cell = report["readings"][name][label]
            assert "error" not in cell, (name, label, cell)
            assert set(cell["figures"]) == set(js.MEASURES) and cell["main"]["call"] in ("stable", "unstable",
                                                                                          "non-finite")
    # per-tensor fp8 moments (diverged in the soak) read unstable at every state, the standard pair's twin (FP32
    # master as remainders) reads exactly 0
    assert all(report["readings"]["std_rem_fp8"][lab]["main"]["call"] == "unstable" for lab in labels)
    assert all(report["readings"]["std_rem_fp32"][lab]["main"]["value"] == 0 for lab in labels)
    assert "std_rem_fp8" not in report["judge"]["at_limit"]["all"]["false_stable"]
    assert "std_rem_fp8" in report["judge"]["at_limit"]["all"]["decided"]
    # the planted starved block: non-finite with the pre-fix arithmetic, finite with the fix
    starved = report["starved"]["readings"]
    assert starved[js.PRE_FIX]["main"]["call"] == "non-finite"
    assert starved["std_fp32_fp8block"]["main"]["call"] != "non-finite"
    assert math.isfinite(starved["std_fp32_fp8block"]["main"]["value"])
    # whatever the reading missed is said, case by case
    for name in report["judge"]["at_limit"]["all"]["false_stable"]:
        assert any(line.startswith(f"at_limit: {name} ") for line in report["could_not_see"])
