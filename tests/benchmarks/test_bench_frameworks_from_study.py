"""``bench_frameworks.py --from-study``: a finished study's front picks in the frameworks (issue 52 item 4), on CPU.

Under ``--smoke`` nothing trains, so these check what the GPU run will rest on: which trials run, in which
frameworks (the study's target, or every framework that runs the trial as it is, the others skipped with why),
at which shape, and that the report carries the front's own figures beside the framework's columns and
verdicts. If they fail, the GPU table compares the wrong trial, framework or figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _spaces import tiny_space_dict
from _studies import one_trial_study

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_frameworks as bench  # noqa: E402
import frameworks_plan as plan  # noqa: E402
from precsearch.config.loader import parse_space  # noqa: E402
from precsearch.policy import Policy, Rule  # noqa: E402
from precsearch.precision import Precision  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REPORT_FIELDS = {"study", "trial", "framework", "baseline", "front_saved_pts", "front_speedup",
                 "framework_saved_pts", "framework_speedup", "model_saved_pts", "saved_diff_pts", "speedup_diff",
                 "saved_pass", "speedup_pass", "status", "runs_otherwise"}


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory) -> Path:
    """``precsearch run search_spaces/cpu_smoke.yaml`` (4 random trials of a 2-block model; about 10 s)."""
    out = tmp_path_factory.mktemp("study") / "smoke"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "precsearch.cli", "run", str(ROOT / "search_spaces/cpu_smoke.yaml"),
                    "--output-dir", str(out)], check=True, capture_output=True, text=True, env=env, cwd=ROOT,
                   timeout=300)
    return out


def _run(tmp_path, *args: str) -> dict:
    out = tmp_path / "from_study.json"
    assert bench.main(["--smoke", *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_front_trials_run_where_they_run_as_they_are(smoke_study, tmp_path, capsys):
    data = _run(tmp_path, "--from-study", str(smoke_study))
    (study,) = data["studies"]
    rows = bench.read_study(smoke_study, None)["picks"]
    front = [p["trial"] for p in rows]
    assert front and [p["trial"] for p in study["picks"]] == front  # the front, most memory saved first
    assert all(p["pareto"] for p in study["picks"])
    # the study's width (cpu_smoke: dim 64, 2 blocks): --layers 4 is more than it has, so its full depth
    assert study["shape"]["dim"] == 64 and study["shape"]["ffn"] == 128 and study["shape"]["layers"] == 2
    assert "full depth" in study["depth"]
    assert (study["shape"]["seq"], study["shape"]["mb"]) == (32, 4)  # the study probe's, as --seq/--mb were not given
    for pick in study["picks"]:
        policy = Policy.from_dict(pick["policy"])
        assert sorted(pick["frameworks"] + [s["framework"] for s in pick["skipped"]]) == sorted(plan.FRAMEWORKS)
        for s in pick["skipped"]:  # each skipped one says what its export would run otherwise
            assert s["why"].startswith("does not run it as it is: ")
        for fw in pick["frameworks"]:
            assert (fw, pick["name"]) in {(r["framework"], r["policy"]) for r in data["rows"]}
            assert (fw, "bf16") in {(r["framework"], r["policy"]) for r in data["rows"]}
        assert policy.to_dict() == pick["policy"]
    entries = data["from_study"]
    assert {(e["trial"], e["framework"]) for e in entries} == {(p["trial"], fw) for p in study["picks"]
                                                               for fw in p["frameworks"]}
    for e in entries:
        assert set(e) >= REPORT_FIELDS
        pick = next(p for p in study["picks"] if p["trial"] == e["trial"])
        # the bench runs the probe's depth (2 blocks): the front's saving on the probe is the one compared
        assert e["front_saved_basis"] == "probe"
        assert e["front_saved_pts"] == pytest.approx(100 * pick["memory_saved_probe"])
        assert e["front_memory_saved_pts"] == pytest.approx(100 * pick["memory_saved"])
        assert e["front_speedup"] == pytest.approx(pick["speedup"])  # the CPU study measured throughput
        assert e["framework_saved_pts"] is None and e["saved_pass"] is None and e["speedup_pass"] is None
        assert e["status"].startswith("skipped (--smoke)")
        assert isinstance(e["model_saved_pts"], float)
    assert all(r["study"] == "smoke" and r["error"].startswith("skipped (--smoke)") for r in data["rows"])
    printed = capsys.readouterr().out
    assert "the study model's width at the full depth" in printed and "front saved" in printed


def test_chosen_trials_and_the_framework_that_cannot_run_one(smoke_study, tmp_path):
    """Every trial of the smoke study is asked for; one with fp8_block MLPs has no torchtitan converter."""
    data = _run(tmp_path, "--from-study", str(smoke_study), "--trials", "0", "1", "2", "3", "--seq", "64")
    assert data["studies"][0]["shape"]["seq"] == 64 and data["studies"][0]["shape"]["mb"] == 4
    picks = {p["trial"]: p for p in data["studies"][0]["picks"]}
    assert sorted(picks) == [0, 1, 2, 3]
    for pick in picks.values():
        blocks = {r.precision for r in Policy.from_dict(pick["policy"]).rules} & {Precision.FP8_BLOCK}
        titan = [s for s in pick["skipped"] if s["framework"] == "torchtitan"]
        if blocks:
            assert titan and "fp8_block -> bf16" in titan[0]["why"]
        if pick["policy"]["warmup_steps"]:  # Megatron has no FP8 warm-up
            assert "megatron" not in pick["frameworks"]


def test_a_study_with_a_target_runs_there_alone(tmp_path, monkeypatch):
    """A study that names its target runs only there, and says so of the others; a study without throughput
    says its speed-up was not measured."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    space = parse_space(tiny_space_dict(target={"name": "megatron"}))
    policy = Policy(rules=(Rule("mlp", ("*.mlp.*",), Precision.FP8_CURRENT),))
    score = {"memory_saved": 0.1, "instability": 0.0, "loss_gap": -0.001, "tokens_per_s": 0.0, "feasible": True,
             "stable": True, "diverged": False}
    _, ws = one_trial_study(tmp_path, space, policy.to_dict(), score, [0.1, 0.0])
    data = _run(tmp_path, "--from-study", str(ws.output_dir))
    (pick,) = data["studies"][0]["picks"]
    assert data["studies"][0]["target"] == "megatron"
    assert pick["frameworks"] == ["megatron"]
    assert {s["framework"]: s["why"] for s in pick["skipped"]} == {
        "torchtitan": "the study's target is megatron", "accelerate": "the study's target is megatron"}
    (entry,) = data["from_study"]
    # a study for megatron scores megatron's run: the front's figure at the bench's depth is that prediction
    from precsearch.runtime.target_memory import target_saving

    layers = space.model.target().n_layers  # the bench runs at most the study model's blocks
    expected = 100 * target_saving(space.model_dump(mode="json"), "megatron", policy, layers).saved
    assert entry["framework"] == "megatron" and entry["front_saved_pts"] == pytest.approx(expected)
    assert entry["front_saved_basis"].startswith(f"megatron's run at {layers} blocks, predicted")
    assert entry["front_memory_saved_pts"] == pytest.approx(10.0)  # the front's own figure, kept
    assert entry["front_speedup"] is None and entry["speedup_note"] == "not measured by the study"


def test_report_verdicts_against_the_targets():
    """Within 2 points and 5% passes; outside fails (rows as a GPU run leaves them)."""
    pick = {"trial": 7, "name": "trial 7", "memory_saved": 0.20, "speedup": 1.30,
            "frameworks": ["megatron", "torchtitan"], "runs_otherwise": {}}
    study = {"study": "s", "model": None, "probe_layers": None, "memory_basis": "target", "picks": [pick]}
    rows = [{"framework": "megatron", "policy": "bf16", "predicted_gib": 10.0},
            {"framework": "megatron", "policy": "trial 7", "predicted_gib": 8.0, "peak_vs_bf16": -0.19,
             "speedup_vs_bf16": 1.26},
            {"framework": "torchtitan", "policy": "bf16", "predicted_gib": 10.0},
            {"framework": "torchtitan", "policy": "trial 7", "predicted_gib": 8.0, "peak_vs_bf16": -0.15,
             "speedup_vs_bf16": 1.10}]
    mega, titan = bench.study_report(study, rows, 4)
    assert mega["saved_diff_pts"] == pytest.approx(1.0) and mega["saved_pass"] is True
    assert mega["speedup_diff"] == pytest.approx(1.30 / 1.26 - 1) and mega["speedup_pass"] is True
    assert titan["saved_pass"] is False and titan["speedup_pass"] is False
    assert mega["model_saved_pts"] == pytest.approx(20.0)
    assert "FAIL" in bench.study_table([mega, titan])


def test_the_worker_gets_a_trial_policy_whole(tmp_path):
    """A fresh worker process knows no study: the spec must carry the policy itself."""
    policy = Policy(rules=(Rule("mlp", ("*.mlp.*",), Precision.FP8_CURRENT),))
    plan.EXTRA_POLICIES["trial 5"] = policy
    try:
        row = {"framework": "megatron", "policy": "trial 5", "export_dir": str(tmp_path)}
        result = bench.run_one(row, plan.Shape(layers=2, dim=64, ffn=128, heads=4, kv_heads=2, vocab=256, seq=32), 120)
    finally:
        plan.EXTRA_POLICIES.clear()
    spec = json.loads((tmp_path / "_spec.json").read_text())
    assert Policy.from_dict(spec["policy_dict"]) == policy and spec["policy"] == "trial 5"
    # the worker read the policy and got as far as the GPU (a policy it could not name leaves no result)
    assert "without a result" not in result["error"], result


def test_max_picks_keeps_the_front_trials_that_save_the_most(smoke_study):
    front = bench.read_study(smoke_study, None)["picks"]
    kept = bench.read_study(smoke_study, None, max_picks=1)["picks"]
    assert len(front) >= 1 and [p["trial"] for p in kept] == [front[0]["trial"]]
    assert kept[0]["memory_saved"] == max(p["memory_saved"] for p in front)


@pytest.mark.parametrize("argv", [["--max-picks", "2"], ["--from-study", "x", "--trials", "1", "--max-picks", "2"],
                                  ["--from-study", "x", "--max-picks", "0"]])
def test_max_picks_needs_a_study_and_no_chosen_trials(argv, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert "--max-picks" in capsys.readouterr().err
