"""benchmarks/bench_soak.py: its verdicts, its non-finite naming, and a CPU smoke run that resumes from its cache.

What would be wrong if these failed: the soak matrix in docs/results/soak.md could call a damaging state benign,
miss or misname a NaN, or run again (and pay again for) runs its cache already holds.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_soak  # noqa: E402
from precsearch.backends.fp8_state_adam import FP8StateAdamW  # noqa: E402


@pytest.mark.parametrize("mean, se, tol, expected", [
    (3.0, 1.0, 0.25, "damaging"),  # 3 - 2 > 0.25
    (1.0, 1.0, 0.25, "undecided"),
    (-2.0, 1.0, 0.25, "benign"),  # -2 + 2 < 0.25
    (0.2, math.nan, 0.25, "undecided"),  # one pair: no SE, no verdict
])
def test_a_verdict_needs_two_standard_errors_beyond_the_tolerance(mean, se, tol, expected):
    assert bench_soak.verdict(mean, se, tol) == expected


def _run(combo, seed, loss=None, nan_step=None):
    r = {"combo": combo, "seed": seed}
    return r | ({"non_finite_step": nan_step, "non_finite_tensor": "w exp_avg"} if nan_step else
                {"held_out_loss": loss})


def test_summary_pairs_each_run_with_its_seeds_standard_run_and_lists_the_non_finite_ones():
    runs = {}
    for seed in range(4):
        runs[(bench_soak.BASE, seed)] = _run(bench_soak.BASE, seed, 2.0 + seed)
        runs[("std_rem_fp8", seed)] = _run("std_rem_fp8", seed, (2.0 + seed) * 2.5)  # +150%: diverged
        runs[("std_fp32_fp8block", seed)] = (_run("std_fp32_fp8block", seed, nan_step=1100) if seed == 2 else
                                             _run("std_fp32_fp8block", seed, (2.0 + seed) * (1 + 1e-4 * seed)))
    rows = bench_soak.summarise(runs)["rows"]
    bad = rows["std_fp32_fp8block"]
    assert bad["non_finite"] == [{"seed": 2, "step": 1100, "tensor": "w exp_avg"}] and bad["paired"] == 3
    assert bad["status"] == "non-finite"
    assert bad["gap_pct"] == pytest.approx(100 * 1e-4 * (0 + 1 + 3) / 3)
    diverged = rows["std_rem_fp8"]
    assert diverged["gap_pct"] == pytest.approx(150.0) and diverged["diverged"] == 4
    assert diverged["status"] == "diverged"


def test_one_diverged_seed_makes_the_row_diverged_and_the_table_names_it():
    # NVFP4's emulated row (H100, 2026-12-07): seven seeds within a few %, one +22%: the mean stays undecided,
    # so only the diverged column says why the row failed
    runs = {}
    for seed in range(8):
        runs[(bench_soak.BASE, seed)] = _run(bench_soak.BASE, seed, 1.0)
        runs[("fp8_current", seed)] = _run("fp8_current", seed, 1.222 if seed == 7 else 1.0 + 0.01 * (seed % 3))
    report = bench_soak.summarise(runs)
    row = report["rows"]["fp8_current"]
    assert row["diverged"] == 1 and row["status"] == "diverged" and row["gaps_pct"][7] == pytest.approx(22.2)
    assert row["at_tolerance"] == "undecided"
    line = next(x for x in bench_soak.table(report).splitlines() if x.startswith("| fp8_current "))
    assert "| 7: +22.2% |" in line, line
    base = next(x for x in bench_soak.table(report).splitlines() if x.startswith(f"| {bench_soak.BASE} "))
    assert "| 0 | 0 | — |" in base, base


def test_the_first_non_finite_tensor_is_named_with_its_state():
    model = torch.nn.Linear(4, 3)
    opt = FP8StateAdamW(model.parameters(), master="none", exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32")
    assert bench_soak.first_non_finite(model, opt) is None
    opt.state[model.bias]["exp_avg_sq"][1] = math.nan
    assert bench_soak.first_non_finite(model, opt) == "bias exp_avg_sq"
    with torch.no_grad():
        model.weight[0, 0] = math.inf
    assert bench_soak.first_non_finite(model, opt) == "weight"  # parameters in order: the weight comes first


def test_the_lr_warms_up_holds_and_anneals_to_zero():
    s = bench_soak.Setup(steps=2000)
    assert bench_soak.lr_at(0, s) == pytest.approx(s.lr / 100)
    assert bench_soak.lr_at(99, s) == bench_soak.lr_at(1499, s) == s.lr
    assert bench_soak.lr_at(1750, s) == pytest.approx(s.lr / 2) and bench_soak.lr_at(1999, s) == pytest.approx(s.lr / 500)


@pytest.mark.slow
def test_a_cpu_smoke_soak_pairs_its_runs_and_its_cache_runs_nothing_twice(tmp_path, capsys):
    cache, out = tmp_path / "runs.jsonl", tmp_path / "soak.json"
    args = ["--smoke", "--steps", "50", "--seeds", "2", "--combos", "std_fp32_fp8block", "--cache", str(cache),
            "--json", str(out)]
    assert bench_soak.main(args) == 0
    report = json.loads(out.read_text())
    row = report["rows"]["std_fp32_fp8block"]
    assert row["runs"] == 2 and row["paired"] == 2 and not row["non_finite"] and math.isfinite(row["gap_pct"])
    assert len(cache.read_text().splitlines()) == 4  # 2 seeds x (the pair's standard run + the combination)
    run = json.loads(cache.read_text().splitlines()[0])
    assert len(run["loss_curve"]) == 1 and run["loss_curve"][0] > run["final_train_loss"]  # 50 steps: one window
    capsys.readouterr()
    assert bench_soak.main(args) == 0
    assert "runs to do" not in capsys.readouterr().out and len(cache.read_text().splitlines()) == 4


@pytest.mark.slow
def test_an_emulated_recipe_row_is_paired_with_the_same_model_in_bf16(tmp_path):
    """MXFP8 runs on no Hopper TE: its row trains precsearch's Llama3 with emulated block Linears, and its gap is
    against that model's BF16 run, not against TE's reference model (a different model: a meaningless gap)."""
    cache, out = tmp_path / "runs.jsonl", tmp_path / "soak.json"
    assert bench_soak.main(["--smoke", "--steps", "50", "--seeds", "2", "--combos", "mxfp8_emulated",
                            "--cache", str(cache), "--json", str(out)]) == 0
    runs = [json.loads(line) for line in cache.read_text().splitlines()]
    assert sorted({r["combo"] for r in runs}) == ["bf16_std_emulated", "mxfp8_emulated"]  # no TE pair was run
    report = json.loads(out.read_text())
    row, pair = report["rows"]["mxfp8_emulated"], report["rows"]["bf16_std_emulated"]
    assert row["paired"] == 2 and math.isfinite(row["gap_pct"]) and row["gap_pct"] != 0.0
    held = {(r["combo"], r["seed"]): r["held_out_loss"] for r in runs}
    expected = [100 * (held[("mxfp8_emulated", s)] / held[("bf16_std_emulated", s)] - 1) for s in (0, 1)]
    assert row["gap_pct"] == pytest.approx(sum(expected) / 2)
    model, _ = bench_soak.build(bench_soak.COMBOS["mxfp8_emulated"], bench_soak.setup(50, smoke=True), 0)
    converted = {type(m).__name__ for n, m in model.named_modules() if n.startswith("decoder.")}
    assert "EmulatedFP8Linear" in converted and type(model.output_layer).__name__ != "EmulatedFP8Linear"


def test_te_rows_are_refused_by_the_cpu_smoke_but_emulated_recipes_are_not():
    with pytest.raises(SystemExit):
        bench_soak.parse_args(["--smoke", "--combos", "fp8_delayed", "--cache", "x.jsonl"])
    assert bench_soak.parse_args(["--smoke", "--combos", "nvfp4_emulated", "--cache", "x.jsonl"]).smoke


def test_only_the_stateless_emulated_rows_are_replayed_as_a_cuda_graph():
    """A captured step replays its kernels as captured: a scaler that carries state across passes (delayed
    scaling's amax history) would be advanced by the capture's warm-up, and TE's rows keep their own state."""
    on_gpu = {name for name, c in bench_soak.COMBOS.items() if bench_soak.graphable(c, "cuda")}
    assert on_gpu == {"bf16_std_emulated", "mxfp8_emulated", "nvfp4_emulated", "fp8_rowwise_emulated"}
    assert not any(bench_soak.graphable(c, "cpu") for c in bench_soak.COMBOS.values())


def test_the_graph_check_runs_eagerly_on_a_cpu_and_finds_the_two_runs_equal(tmp_path):
    out = tmp_path / "check.json"
    assert bench_soak.main(["--smoke", "--graph-check", "12", "--combos", "bf16_std_emulated", "--json",
                            str(out)]) == 0
    [row] = json.loads(out.read_text())["graph_check"]
    assert row["graphed"] is False and row["max_loss_diff"] == 0.0
    assert row["eager_step_ms"] > 0 and row["graphed_step_ms"] > 0


def test_the_graph_check_needs_timed_steps_and_the_soak_a_cache():
    with pytest.raises(SystemExit):
        bench_soak.parse_args(["--graph-check", str(bench_soak.TIMED_FROM)])
    with pytest.raises(SystemExit):
        bench_soak.parse_args(["--combos", "bf16_std"])
