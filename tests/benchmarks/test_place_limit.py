"""benchmarks/place_limit.py on a synthetic judge JSON: the placed limit separates the decided cases, a pre-fix
(non-finite) case is listed apart, and cases that no limit separates are said to be so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import place_limit  # noqa: E402


def judge(readings: dict[str, tuple[float, float]], truths: dict[str, str], pre_fix: tuple[str, ...] = ()) -> dict:
    state = "probe (50)"
    return {"meta": {"measure": "update_norm", "date": "d", "device": "cpu"}, "states": {state: 50, "late": 900},
            "truth": {"source": "t", "detection_limit_pct": 2.5,
                      "cases": {c: {"at_limit": v} for c, v in truths.items()}},
            "cases": {c: {"truth": None if c in pre_fix else c, "pre_fix": c in pre_fix} for c in readings},
            "readings": {c: {state: {"main": {"value": v, "se": se}}} for c, (v, se) in readings.items()}}


def test_the_limit_calls_every_benign_case_stable_and_no_damaging_case_stable(tmp_path):
    j = judge({"fp8": (0.0003, 0.00005), "moments": (0.0015, 0.00003), "no_master": (0.0022, 0.0003),
               "per_tensor_moments": (70.0, 25.0), "nan_before_fix": (0.0011, 0.00003), "undecided": (0.01, 0.001)},
              {"fp8": "benign", "moments": "benign", "no_master": "damaging", "per_tensor_moments": "damaging",
               "undecided": "undecided"}, pre_fix=("nan_before_fix",))
    path = tmp_path / "judge.json"
    path.write_text(json.dumps(j))
    out = tmp_path / "placed.json"
    assert place_limit.main(["--judge", str(path), "--json", str(out)]) == 0
    placed = json.loads(out.read_text())
    assert placed["separable"] and placed["limit"] == 0.002
    assert placed["lowest"] == (0.0015 + 2 * 0.00003) / 0.9 and placed["highest"] == 0.0022
    bands = {r["case"]: r["band"] for r in placed["cases"]}
    assert bands["fp8"] == bands["moments"] == "stable"
    assert bands["no_master"] == "near the limit" and bands["per_tensor_moments"] == "unstable"
    assert "undecided" not in bands  # the soak did not decide it: it places nothing
    assert [r["truth"] for r in placed["cases"] if r["case"] == "nan_before_fix"] == ["non-finite"]


def test_overlapping_cases_are_reported_as_not_separable(tmp_path, capsys):
    j = judge({"benign": (0.002, 0.0001), "damaging": (0.001, 0.0001)}, {"benign": "benign", "damaging": "damaging"})
    placed = place_limit.place(j, "update_norm", "probe (50)", 0.1)
    assert not placed["separable"] and placed["limit"] is None
    assert "no limit separates them" in place_limit.report(placed, j)


def test_an_unknown_state_is_refused_naming_the_valid_ones(tmp_path, capsys):
    path = tmp_path / "judge.json"
    path.write_text(json.dumps(judge({"a": (0.1, 0.01)}, {"a": "benign"})))
    assert place_limit.main(["--judge", str(path), "--state", "end", "--json", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "'end'" in err and "probe (50)" in err


def test_round_within_prefers_a_1_2_5_number_and_falls_back_to_the_middle():
    assert place_limit.round_within(0.00172, 0.00219) == 0.002
    assert place_limit.round_within(0.0031, 0.0042) == float(f"{(0.0031 * 0.0042) ** 0.5:.2g}")


def test_a_newer_soak_report_replaces_the_truth_the_judge_ran_with(tmp_path):
    # the judge read "later" without a verdict; a newer soak decided it benign: it now places the limit
    j = judge({"fp8": (0.0003, 0.00005), "later": (0.0016, 0.00003), "no_master": (0.0022, 0.0003)},
              {"fp8": "benign", "no_master": "damaging"})
    soak = {"detection_limit_pct": 2.5, "tolerance_pct": 0.25, "date": "d", "device": "gpu",
            "rows": {"fp8": {"at_detection_limit": "benign", "at_tolerance": "undecided"},
                     "later": {"at_detection_limit": "benign", "at_tolerance": "benign"},
                     "no_master": {"at_detection_limit": "damaging", "at_tolerance": "damaging"}}}
    (tmp_path / "judge.json").write_text(json.dumps(j))
    (tmp_path / "soak.json").write_text(json.dumps(soak))
    out = tmp_path / "placed.json"
    assert place_limit.main(["--judge", str(tmp_path / "judge.json"), "--truth", str(tmp_path / "soak.json"),
                             "--json", str(out)]) == 0
    placed = json.loads(out.read_text())
    assert {r["case"]: r["truth"] for r in placed["cases"]}["later"] == "benign"
    assert placed["lowest"] == (0.0016 + 2 * 0.00003) / 0.9 and placed["truth"].endswith("soak.json")
