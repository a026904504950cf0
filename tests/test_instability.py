"""One stability unit, everywhere (issue 53, item 1).

The quickstart's terminal said ``instability 2.473% [...(+2.0x)]`` of a limit of 2.0 seed spreads, MLflow
``instability_spreads 1.98``, the exported policy ``instability: 0.0247`` and its reason ``1.982 seed
spreads``: four numbers in three units for one trial, and one of them rounded onto the limit. Here one
finished study of each kind (``noise``, and a ``damage`` reading) is read through the terminal's trial
line, what the MLflow tracker logs, ``front.csv`` and the exported ``policy.yaml``: each output must give
the same value in the same unit, named by the same string, against the same limit.
"""

from __future__ import annotations

import csv
import math
import re

import pytest
import yaml

from _spaces import tiny_space_dict
from _studies import one_trial_study
from precsearch.config.loader import parse_space
from precsearch.export.format_output import header
from precsearch.instability import Reading, StudyUnit, number
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.result import ProbeResult
from precsearch.runtime.study_export import export
from precsearch.search.front import format_table, trial_rows
from precsearch.search.scoring import instability_reading, score, stability_metrics, verdict_line
from precsearch.tracking.experiment_view import metric_columns
from precsearch.tracking.front_report import write_front
from precsearch.tracking.review_columns import review_metrics
from precsearch.tracking.trial_record import SearchReading, trial_metrics, trial_tags

POLICY = Policy(rules=(Rule("all", ("*",), Precision.FP8_CURRENT),), clip_grad=1.0)


def _result(eval_loss: float, damage: dict | None = None) -> ProbeResult:
    return ProbeResult(losses=[3.0, 2.5], eval_loss=eval_loss, peak_memory_bytes=1000, target_memory_bytes=900,
                       tokens_per_s=100.0, damage=damage)


def test_a_value_just_below_the_limit_never_prints_as_the_limit():
    """1.982 of a 2.0 limit printed as ``2.0x``: a pass that reads as the limit itself."""
    assert number(1.982, 2.0) == "1.98" and number(1.9996, 2.0) == "1.9996" and number(2.0004, 2.0) == "2.0004"
    assert number(0.024731, 0.01) == "0.0247" and number(2.0, 2.0) == "2"


@pytest.mark.parametrize(("value", "se", "band"), [
    (1.5, math.nan, "stable"), (1.8, math.nan, "stable"), (1.98, math.nan, "near the limit"),
    (2.01, math.nan, "unstable"), (1.5, 0.2, "near the limit"), (1.5, 0.1, "stable"), (2.3, 0.1, "unstable"),
    (2.1, 0.1, "near the limit"), (math.nan, math.nan, "unknown")])
def test_the_band_reads_the_interval_against_the_limit_with_a_tenth_of_margin(value, se, band):
    """Stable only clear of 90% of the limit (with 2 SE where the reading has them); unstable only when the whole
    interval is above it. A 1.5 ± 0.2 (SE) reading reaches 1.9: it cannot be called clear of a 2.0 limit."""
    assert Reading(value, se, StudyUnit("noise" if math.isnan(se) else "damage", 2.0, "grad_noise")).band == band


def _study(tmp_path, overrides: dict, result: ProbeResult, floor: float, standard: dict | None = None):
    """A finished one-trial study as ``precsearch run`` stores it, and the trial's score."""
    space = parse_space(tiny_space_dict(**overrides))
    s = score(result, _result(2.0), space.objectives, noise_floor=floor, standard=standard)
    study, ws = one_trial_study(tmp_path, space, POLICY.to_dict(), s.to_dict(), [s.memory_saved, s.instability])
    return space, s, study, ws


def _four_outputs(tmp_path, overrides: dict, result: ProbeResult, floor: float = math.nan,
                  standard: dict | None = None) -> dict:
    """The trial's instability as each output gives it: (value text, unit name, limit); and its multiple of the
    standard FP8 recipe's reading as each gives it (``multiples``: None where an output gives none)."""
    space, s, study, ws = _study(tmp_path, overrides, result, floor, standard)
    objectives = space.objectives
    line = verdict_line(s, objectives)  # the terminal's trial line, after "memory saved ...%"
    reading = SearchReading(s, line, stability_metrics(s), {}, objectives.instability_unit, 2, "-",
                            instability_reading(s, objectives))
    metrics = trial_metrics(result, _result(2.0), 3, reading)
    metrics |= review_metrics(metrics, objectives.instability_unit)  # as MlflowTracker.finish_trial logs them
    tags = trial_tags(result, study.trials[0], reading)
    assert "instability_in_unit" in metric_columns(objectives.instability_unit)  # the runs table shows it
    write_front(trial_rows(study, ["memory_saved", "instability"]), tmp_path / "front",
                objectives.instability_limit, objectives.instability_unit)
    with (tmp_path / "front" / "front.csv").open() as fh:
        front = next(csv.DictReader(fh))
    (tmp_path / "policy.yaml").write_text(export(study, ws, trial=0).files["policy.yaml"])
    exported = yaml.safe_load((tmp_path / "policy.yaml").read_text())["provenance"]["objectives"]
    limit = objectives.instability_limit
    said = re.search(r" = (\S+) the standard FP8 recipe's (\S+) \(", line)
    shown = lambda v: None if v in (None, "") else f"{number(float(v), digits=2)}x"  # noqa: E731 - as printed
    return {
        "multiples": {"terminal": said.group(1) if said else None,
                      "front.csv": shown(front.get("instability_vs_standard")),
                      "mlflow": shown(metrics.get("instability_vs_standard")),
                      "policy.yaml": shown(exported.get("instability_vs_standard"))},
        "standards": {"terminal": said.group(2) if said else None, "mlflow": tags.get("instability_standard"),
                      "front.csv": front.get("instability_standard"),
                      "policy.yaml": exported.get("instability_standard")},
        "exported": exported, "front": front, "tags": tags,
        "terminal": line,
        "mlflow": (number(metrics["instability_in_unit"], limit), tags["instability_unit"], tags["instability_limit"]),
        "front.csv": (number(float(front["instability_in_unit"]), limit), front["instability_unit"], number(limit)),
        "policy.yaml": (number(exported["instability"], exported["instability_limit"]), exported["instability_unit"],
                        number(exported["instability_limit"])),
        "band": {tags["instability_band"], front["instability_band"], exported["instability_band"]},
        "table": format_table(trial_rows(study, ["memory_saved", "instability"])),
    }


def test_a_noise_study_gives_one_value_in_seed_spreads_everywhere(tmp_path):
    """The quickstart's trial: a 2.473% gap over a 1.25% noise floor is 1.98 of a 2.0 limit."""
    out = _four_outputs(tmp_path, {"objectives.stability_unit": "noise", "objectives.stability_limit": 2.0,
                                   "objectives.reference_seeds": 3}, _result(2.0 * 1.02473), floor=0.0125)
    shown = ("1.98", "BF16 seed spreads", "2")
    assert out["terminal"].startswith("instability 1.98 BF16 seed spreads; limit 2: near the limit [feasible; ")
    assert "(+1.98x)" in out["terminal"] and "2.0x" not in out["terminal"]
    assert out["mlflow"] == out["front.csv"] == out["policy.yaml"] == shown
    assert out["band"] == {"near the limit"}
    assert "instability in BF16 seed spreads; limit 2" in out["table"] and " 1.98  near the limit" in out["table"]


def test_a_damage_study_gives_one_value_in_its_measure_with_its_interval(tmp_path):
    """The 8B study printed ``instability 0.00138 update_norm`` and ``0.00138x``: no limit, no interval."""
    state = {"step": 2, "total": {"update_norm": [0.00138, 0.0003]}, "units": {}}  # as the reader stores one
    result = _result(2.0002, damage={"value": 0.00138, "se": 0.0003, "measure": "update_norm", "state_step": 2,
                                     "seconds": 0.1, "states": [state]})
    out = _four_outputs(tmp_path, {"objectives.reading": "damage"}, result)
    name = "update_norm (AdamW update error bias^2 / update^2)"
    # the default limit (0.002): the interval's upper end, 0.00198, is past 90% of it
    assert out["terminal"].startswith(f"instability 0.00138 ± 0.0006 (2 SE) {name}; limit 0.002: near the limit [feasible")
    assert out["mlflow"] == out["front.csv"] == out["policy.yaml"] == ("0.00138", name, "0.002")
    assert out["band"] == {"near the limit"}
    assert "0.00138 ± 0.0006 (2 SE)" in out["table"] and name in out["table"]
    # a study without the standard FP8 recipe's reading shows no multiple of it anywhere: none is made up
    assert set(out["multiples"].values()) == {None} and "standard" not in out["terminal"] + out["table"]


def test_a_damage_study_beside_the_standard_recipe_gives_one_multiple_everywhere(tmp_path):
    """Issue 53: ``update_norm 0.00157`` means nothing without the docs; ``= 1.3x the standard FP8 recipe's 0.0012``
    does. The multiple is the trial's reading over the standard's at the same clip value, and the terminal's trial
    line, front.csv, the MLflow metric and the exported policy.yaml give the same one, with the standard's reading
    and what it ran; the unit, its limit and its band stay as they were."""
    state = {"step": 2, "total": {"update_norm": [0.00157, 0.0004]}, "units": {}}
    result = _result(2.0002, damage={"value": 0.00157, "se": 0.0004, "measure": "update_norm", "state_step": 2,
                                     "seconds": 0.1, "states": [state]})
    recipe = "FP8 delayed scaling on every block Linear, BF16 output layer, FP32 master and moments"
    standard = {"value": 0.0012, "se": 0.0001, "measure": "update_norm", "recipe": recipe, "nonfinite": None}
    out = _four_outputs(tmp_path, {"objectives.reading": "damage"}, result, standard=standard)
    name = "update_norm (AdamW update error bias^2 / update^2)"
    assert out["terminal"].startswith(f"instability 0.00157 ± 0.0008 (2 SE) {name} = 1.3x the standard FP8 recipe's "
                                      f"0.0012 ({recipe}); limit 0.002: near the limit [feasible")
    assert set(out["multiples"].values()) == {"1.3x"}, out["multiples"]
    assert out["exported"]["instability_vs_standard"] == pytest.approx(0.00157 / 0.0012)
    assert float(out["front"]["instability_vs_standard"]) == pytest.approx(0.00157 / 0.0012)
    assert {float(v) for v in out["standards"].values()} == {0.0012}
    assert out["exported"]["standard_recipe"] == out["tags"]["standard_recipe"] == recipe
    assert out["mlflow"] == out["front.csv"] == out["policy.yaml"] == ("0.00157", name, "0.002")
    assert out["band"] == {"near the limit"}
    assert "1.3x" in out["table"] and f"multiple of the standard FP8 recipe's at the same states and clip value " \
        f"({recipe}): 0.0012" in out["table"]
    # the framework files an export writes (Megatron's script, torchtitan's TOML...) say it in their header too
    assert f"# instability = 1.3x the standard FP8 recipe's 0.0012 ({recipe})" in \
        header({"objectives": out["exported"]}, "a policy")


def test_a_trial_without_a_figure_of_its_own_gets_no_multiple():
    """A diverged probe scores instability 1.0, a failed reading NaN: neither is a reading to divide, and a standard
    that read a non-finite value is no yardstick."""
    objectives = parse_space(tiny_space_dict(**{"objectives.reading": "damage"})).objectives
    standard = {"value": 0.0012, "recipe": "x"}
    diverged = ProbeResult(losses=[3.0, math.nan], eval_loss=math.nan, diverged=True, peak_memory_bytes=1000,
                           target_memory_bytes=900, tokens_per_s=100.0)
    unread = _result(2.0, damage=None)
    for result, given in ((diverged, standard), (unread, standard),
                          (_result(2.0, damage={"value": 0.001, "se": 0.0001}), standard | {"nonfinite": {"step": 1}})):
        s = score(result, _result(2.0), objectives, standard=given)
        assert math.isnan(s.instability_vs_standard) and "standard" not in verdict_line(s, objectives)
