"""Stability scored against noise: the BF16 seed spread, the stability unit, the stress probe."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.config.space import ObjectivesSection, ProbeSection
from precsearch.errors import UserError
from precsearch.probe.result import ProbeResult
from precsearch.runtime.reference import ReferenceCache, gather_references, reference_key
from precsearch.search.scoring import measure_noise_floor, score, verdict
from precsearch.runtime.workspace import Workspace

CPU = torch.device("cpu")


def _result(eval_loss: float, diverged: bool = False) -> ProbeResult:
    return ProbeResult(losses=[3.0, 2.5], eval_loss=eval_loss, peak_memory_bytes=1000, diverged=diverged,
                       target_memory_bytes=1000,
                       tokens_per_s=100.0)


def test_noise_floor_is_the_relative_sample_spread_of_the_seeds():
    """2.00 +- 0.02 over three seeds is a 1% floor; a population std would understate it by sqrt(2/3)."""
    floor = measure_noise_floor([_result(2.0), _result(2.02), _result(1.98)])
    assert floor == pytest.approx(0.01)


def test_one_seed_has_no_noise_floor():
    """With one seed the spread is unknown: a made-up 0 would make every gap look infinitely significant."""
    assert math.isnan(measure_noise_floor([_result(2.0)]))
    s = score(_result(2.01), _result(2.0), ObjectivesSection(reference_seeds=1))
    assert math.isnan(s.noise_floor) and math.isnan(s.gap_in_noise) and s.feasible  # relative unit still judges


def test_gap_is_reported_in_both_units_and_the_limit_read_in_the_chosen_one():
    """A 1.5% gap over a 1% floor is 1.5 sigma: inside a 2-sigma limit, outside a 1% relative one."""
    ref, mine = _result(2.0), _result(2.03)
    noise = score(mine, ref, ObjectivesSection(stability_unit="noise", stability_limit=2.0), noise_floor=0.01)
    assert noise.loss_gap == pytest.approx(0.015) and noise.gap_in_noise == pytest.approx(1.5)
    assert noise.instability == pytest.approx(0.015)  # the objective stays relative
    assert noise.feasible and noise.constraint == pytest.approx(1.5 - 2.0)
    relative = score(mine, ref, ObjectivesSection(stability_limit=0.01), noise_floor=0.01)
    assert not relative.feasible and relative.gap_in_noise == pytest.approx(1.5)
    tight = score(mine, ref, ObjectivesSection(stability_unit="noise", stability_limit=1.0), noise_floor=0.01)
    assert not tight.feasible


def test_every_verdict_shows_the_noise_floor_it_is_read_against():
    """A verdict without the floor hid that the quickstart called 0.8-sigma gaps unstable (issue 16)."""
    s = score(_result(2.03), _result(2.0), ObjectivesSection(stability_limit=0.01), noise_floor=0.05)
    assert verdict(s) == "unstable; gap +1.50% vs BF16 seed noise 5.00% (+0.30x)"
    one_seed = score(_result(2.0), _result(2.0), ObjectivesSection(reference_seeds=1))
    assert verdict(one_seed) == "feasible; gap +0.00% vs BF16 seed noise unknown (one seed)"


def test_noise_unit_never_passes_a_diverged_or_unmeasured_probe():
    """Diverged instability (1.0) divided into sigmas could fall under a 2-sigma limit; it must not."""
    objectives = ObjectivesSection(stability_unit="noise", stability_limit=200.0)
    diverged = score(_result(math.nan, diverged=True), _result(2.0), objectives, noise_floor=0.01)
    assert not diverged.feasible and diverged.constraint > 0
    unknown = score(_result(2.0), _result(2.0), objectives, noise_floor=math.nan)
    assert not unknown.feasible and unknown.constraint > 0


def test_stress_is_reported_and_only_constrains_when_asked():
    """A policy fine at the base lr but diverging under stress: the verdict must show both."""
    stress = (_result(math.nan, diverged=True), _result(2.2))
    off = score(_result(2.0), _result(2.0), ObjectivesSection(stress={"lr_multiplier": 4.0}), stress=stress)
    assert off.feasible and off.stable and off.stress_diverged and off.stable_under_stress is False
    on = score(_result(2.0), _result(2.0), ObjectivesSection(stress={"lr_multiplier": 4.0, "in_constraint": True}),
               stress=stress)
    assert on.stable and not on.feasible and on.constraint > 0
    gap = score(_result(2.0), _result(2.0), ObjectivesSection(stress={"lr_multiplier": 4.0}),
                stress=(_result(2.31), _result(2.2)))
    assert gap.stress_loss_gap == pytest.approx(0.05) and gap.stable_under_stress is False  # vs the stressed BF16
    assert score(_result(2.0), _result(2.0), ObjectivesSection()).stable_under_stress is None  # no stress probe


def _space(**overrides):
    return parse_space(tiny_space_dict(**overrides))


def test_noise_unit_needs_two_seeds_and_defaults_to_two_sigma():
    with pytest.raises(UserError) as exc:
        _space(**{"objectives": {"stability_unit": "noise", "reference_seeds": 1}})
    assert exc.value.field == "objectives" and "reference_seeds >= 2" in str(exc.value)
    assert _space(**{"objectives": {"stability_unit": "noise"}}).objectives.stability_limit == 2.0
    assert _space().objectives.stability_limit == 0.01  # the relative default is unchanged


def test_stress_settings_are_checked():
    with pytest.raises(UserError) as exc:
        _space(**{"objectives": {"stress": {"in_constraint": True}}})
    assert exc.value.field == "objectives.stress" and "lr_multiplier" in str(exc.value)
    with pytest.raises(UserError) as exc:
        _space(**{"objectives": {"stress": {"lr_multiplier": 0.5}}})
    assert exc.value.field == "objectives.stress.lr_multiplier"


def test_the_old_spike_threshold_key_says_where_it_moved():
    with pytest.raises(UserError, match="probe.spike_threshold"):
        _space(**{"objectives": {"spike_threshold": 0.3}})


def test_references_run_once_per_seed_and_stress_lr_then_come_from_the_cache(tmp_path: Path):
    """Each seed and the stress lr is its own BF16 probe; a second trial must not rerun any of them."""
    space = _space(**{"probe.seed": 5, "objectives": {"reference_seeds": 3, "stress": {"lr_multiplier": 4.0}}})
    ran: list[ProbeSection] = []

    def run(probe: ProbeSection, label: str, leg=None) -> ProbeResult:
        ran.append(probe)
        return _result(2.0 + 0.01 * len(ran))

    cache = ReferenceCache(tmp_path)
    refs = gather_references(space, cache, CPU, 1.0, run)
    assert [p.seed for p in ran] == [5, 6, 7, 5]
    assert ran[-1].lr == pytest.approx(4.0 * space.probe.lr) and ran[0].lr == space.probe.lr
    assert refs.paired.eval_loss == pytest.approx(2.01) and refs.stress.eval_loss == pytest.approx(2.04)
    assert refs.noise_floor == pytest.approx(0.01 / 2.02)
    assert len(list(tmp_path.glob("*.json"))) == 4
    assert reference_key(space, 1.0, CPU) == reference_key(space, 1.0, CPU, ran[0])  # seed 0's key is unchanged
    again = gather_references(space, ReferenceCache(tmp_path), CPU, 1.0, run)  # a fresh process: from disk
    assert len(ran) == 4 and [r.eval_loss for r in again.seeds] == [r.eval_loss for r in refs.seeds]


def test_a_bf16_reference_diverging_under_stress_blames_the_multiplier(tmp_path: Path):
    space = _space(**{"objectives": {"reference_seeds": 1, "stress": {"lr_multiplier": 50.0}}})

    def run(probe: ProbeSection, label: str, leg=None) -> ProbeResult:
        return _result(math.nan, diverged=probe.lr > space.probe.lr)

    with pytest.raises(UserError) as exc:
        gather_references(space, ReferenceCache(tmp_path), CPU, 1.0, run)
    assert exc.value.field == "objectives.stress.lr_multiplier"


def test_a_study_logs_noise_and_stress_figures(tmp_path: Path, capsys):
    """End to end: two seeds, a stress probe; the figures must reach Optuna and MLflow, not only the Score."""
    data = tiny_space_dict(**{"study.n_trials": 2, "probe.steps": 6,
                              "objectives": {"reference_seeds": 2, "stress": {"lr_multiplier": 3.0}}})
    out = tmp_path / "out"
    assert main(["run", str(write_space(tmp_path, data)), "--output-dir", str(out), "--no-progress"]) == 0
    ws = Workspace.load(out)
    trials = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url).trials
    assert len(list((out / "references").glob("*.json"))) == 3  # seeds 0 and 1, and the stress lr (one clip value)
    score_ = trials[0].user_attrs["score"]
    assert score_["noise_floor"] > 0 and score_["stable_under_stress"] is not None
    assert "stress_result" in trials[0].user_attrs
    client = MlflowClient(ws.tracking_uri)
    run = client.get_run(trials[0].user_attrs["mlflow_run_id"])
    assert {"noise_floor", "gap_in_noise", "stress_loss_gap", "stable_under_stress", "reference_seeds"} \
        <= set(run.data.metrics)
    assert len(client.get_metric_history(run.info.run_id, "stress_train_loss")) == 6
    floor = f"vs BF16 seed noise {100 * score_['noise_floor']:.2f}%"
    assert floor in run.data.tags["verdict"]  # the verdict and the floor it was read against, side by side
    capsys.readouterr()
    assert main(["front", "--output-dir", str(out), "--all"]) == 0
    table = capsys.readouterr().out
    assert "BF16 seed noise" in table.splitlines()[1] and f"{100 * score_['noise_floor']:.2f}%" in table
