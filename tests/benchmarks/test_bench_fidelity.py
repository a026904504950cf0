"""benchmarks/bench_fidelity.py: its rank statistic and its CPU smoke run."""

import importlib.util
import json
import math
from pathlib import Path

import sys

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fidelity.py"
_spec = importlib.util.spec_from_file_location("bench_fidelity", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_fidelity"] = bench  # dataclasses look their module up by name
_spec.loader.exec_module(bench)


def test_kendall_tau_b_on_known_rankings():
    """+1 for the same order, -1 reversed, tau-b's tie correction (1/sqrt(2*... )) checked by hand,
    and a diverged run (inf) ranks worst. A wrong sign would report fidelity where there is none."""
    assert bench.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert bench.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # pairs: (1,2) tie in x; (1,3) and (2,3) concordant -> (2 - 0) / sqrt((2 + 1) * 2)
    assert math.isclose(bench.kendall_tau([1, 1, 2], [1, 2, 3]), 2 / math.sqrt(6))
    assert bench.kendall_tau([0.01, math.inf, 0.0], [0.02, math.inf, -0.01]) == 1.0
    assert math.isnan(bench.kendall_tau([1, 1], [1, 2]))


@pytest.mark.slow
def test_smoke_run_writes_a_table_and_json(tmp_path, capsys, monkeypatch):
    """The CPU smoke mode runs the whole pipeline, two runs at a time in worker processes: pre-tokenized
    corpus, one run per policy and seed cut into three rungs continuing each other, paired BF16
    references cut the same way, and a summary. A second call with the same cache and ``--only`` runs
    nothing and reads the same numbers; a cache of other settings is refused."""
    monkeypatch.syspath_prepend(str(_PATH.parent))  # the spawned workers import the script by name
    assert bench.main(["--smoke", "--jobs", "2", "--out", str(tmp_path), "--corpus-dir", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("*_bench_fidelity_smoke.json")).read_text())
    assert (tmp_path / "stdlib_bytes.npy").exists()
    assert report["meta"]["long_steps"] >= 10 * report["meta"]["short_steps"]
    assert report["summary"]["n_policies"] == len(report["rows"]) == 3
    assert 0.0 <= report["summary"]["agreement"] <= 1.0
    assert all({"gap", "stable", "diverged"} <= set(r["short"]) for r in report["rows"])
    assert all(len(r["rungs"]) == 3 and r["rungs"][-1] == r["long"] for r in report["rows"])
    assert [v["steps"] for v in report["rows"][1]["rungs"]] == report["meta"]["rungs"]  # continued, not retrained
    assert {"short", "short_tail", "promoted", "risk_score"} <= set(report["summary"])
    captured = capsys.readouterr()
    assert "Kendall tau-b" in captured.out and "running 10, 2 at a time" in captured.err

    again = tmp_path / "again"
    assert bench.main(["--smoke", "--only", "fp8_delayed", "--out", str(again), "--corpus-dir", str(tmp_path),
                       "--cache", str(tmp_path / "fidelity_runs")]) == 0
    assert "running 0" in capsys.readouterr().err
    row = json.loads(next(again.glob("*_bench_fidelity_smoke.json")).read_text())["rows"]
    assert [r["policy"] for r in row] == ["fp8_delayed, blocks"] and row[0]["rungs"] == report["rows"][1]["rungs"]
    with pytest.raises(SystemExit, match="other settings"):
        bench.main(["--smoke", "--lr", "0.5", "--out", str(again), "--cache", str(tmp_path / "fidelity_runs")])


def test_an_unfinished_comparison_writes_a_partial_report(tmp_path, capsys):
    """No run fits a zero deadline: nothing is summarised, every policy is listed as missing."""
    assert bench.main(["--smoke", "--deadline", "0", "--out", str(tmp_path), "--corpus-dir", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("*_partial.json")).read_text())
    assert report["rows"] == [] and len(report["meta"]["missing"]) == 3
    assert "incomplete: 3 policies" in capsys.readouterr().out


def test_readings_on_cpu_train_nothing_and_take_the_missing_readings(tmp_path, capsys):
    """``--readings-on-cpu`` (the judge's runs from a GPU's cache, its readings here): no run is trained, every
    policy gets its fixed-state reading (every figure, update_norm too) and the report says where they ran."""
    assert bench.main(["--smoke", "--readings-on-cpu", "--out", str(tmp_path), "--corpus-dir", str(tmp_path)]) == 0
    assert "running 0" in capsys.readouterr().err
    cache = tmp_path / "fidelity_runs"
    runs = [p for p in cache.glob("*.json") if p.name != "settings.json" and not p.name.startswith("damage-")]
    assert runs == []  # trained nothing
    readings = [json.loads(p.read_text()) for p in cache.glob("damage-*.json")]
    assert len(readings) == 3 and all("update_norm" in r["states"][0]["total"] for r in readings)
    report = json.loads(next(tmp_path.glob("*_partial.json")).read_text())
    assert report["meta"]["readings_on"] == "cpu, emulated FP8" and len(report["meta"]["missing"]) == 3


def _v(gap: float, stable: bool, diverged: bool = False, tail: float = 0.0) -> dict:
    return {"gap": gap, "tail_gap": tail, "stable": stable, "tail_stable": stable, "diverged": diverged}


def test_summary_reads_each_early_verdict_against_the_long_gap():
    """Each reading's tau is against the long run's gap and its agreement against the long call; a
    fragile policy counts as flagged when any early reading called it unstable or risky."""
    rows = [
        {"policy": "a", "short": _v(0.00, True), "promoted": _v(0.00, True), "long": _v(0.00, True), "risk": 0.1,
         "fragile": False, "flagged_before_long": False},
        {"policy": "b", "short": _v(-0.03, True), "promoted": _v(0.02, False), "long": _v(0.05, False), "risk": 0.9,
         "fragile": True, "flagged_before_long": True},
        {"policy": "c", "short": _v(0.02, False), "promoted": _v(0.01, True), "long": _v(0.01, True), "risk": 0.2,
         "fragile": False, "flagged_before_long": True},
    ]
    s = bench.summarise(rows, 0.01)
    assert s["short"]["agreement"] == pytest.approx(1 / 3)  # a right; b missed; c a false alarm
    assert s["promoted"]["agreement"] == 1.0 and s["promoted"]["kendall_tau"] == 1.0
    assert s["risk_score"]["agreement"] == 1.0 and s["risk_score"]["kendall_tau"] == pytest.approx(1.0)
    assert s["fragile_flagged_before_long"] == {"b": True}


def test_a_verdict_averages_seeds_and_a_diverged_seed_diverges_it():
    from precsearch.probe.result import ProbeResult

    def run(eval_loss: float, diverged: bool = False) -> ProbeResult:
        return ProbeResult(losses=[2.0] * 8, eval_loss=eval_loss, diverged=diverged)

    refs = [run(2.0), run(2.0)]
    mean = bench.verdict([run(2.02), run(2.06)], refs, 0.01)
    assert mean.gap == pytest.approx(0.02) and not mean.stable and mean.tail_gap == 0.0 and mean.tail_stable
    gone = bench.verdict([run(2.0), run(math.nan, diverged=True)], refs, 0.01)
    assert gone.diverged and not gone.stable and math.isnan(gone.gap)


def test_only_policies_beyond_the_long_runs_own_spread_are_scored_as_decided():
    """With a 2% BF16 spread at the long rung, a +1.5% long gap is no verdict; +6% is unstable, -5% stable.
    A reading is scored on those alone: here the short one misses the +6% policy, the promoted one not."""
    rows = [
        {"policy": "noise", "short": _v(0.0, True), "promoted": _v(0.0, True), "long": _v(0.015, False), "risk": 0.0,
         "fragile": False, "flagged_before_long": False},
        {"policy": "bad", "short": _v(-0.03, True), "promoted": _v(0.05, False), "long": _v(0.06, False), "risk": 0.9,
         "fragile": False, "flagged_before_long": True},
        {"policy": "good", "short": _v(-0.02, True), "promoted": _v(-0.01, True), "long": _v(-0.05, True),
         "risk": 0.0, "fragile": False, "flagged_before_long": False},
    ]
    s = bench.summarise(rows, 0.01, noise=0.02)
    assert s["decided"] == ["bad", "good"]
    assert s["short"]["decided_agreement"] == 0.5 and s["promoted"]["decided_agreement"] == 1.0
    assert math.isnan(bench.summarise(rows, 0.01)["short"]["decided_agreement"])  # spread unknown: nothing decided
