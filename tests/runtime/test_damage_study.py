"""A whole study read by the fixed-state reading (``objectives.reading: damage``), through the CLI.

What would be wrong if these failed: the reading does not reach the trials (the probe process does not read
it, or the result loses it on the way), the score ignores it, or MLflow does not show it per trial and unit.
"""

from __future__ import annotations

import contextlib
import io
import math

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from _spaces import tiny_space_dict, write_space
from precsearch.arch.units import unit_names
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.runtime.workspace import Workspace


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("damage")
    # a state inside the searched warm-up (step 3 of 12, warm-ups 0 and 4): without one, validate refuses it
    data = tiny_space_dict(**{"objectives.reading": "damage", "objectives.damage.tokens_per_step": 4096,
                              "objectives.damage.states": [0.25, 1.0], "study.n_trials": 3})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(write_space(tmp, data)), "--output-dir", str(tmp / "out"), "--no-progress"]) == 0
    ws = Workspace.load(tmp / "out")
    return ws, printed.getvalue(), unit_names(parse_space(data).model.probe())


def test_every_trial_is_scored_by_its_reading(study):
    ws, log, _ = study
    stored = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    trials = [t for t in stored.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert trials
    limit = stored.user_attrs["space"]["objectives"]["damage"]["limit"]
    assert limit == 0.002  # the default measure's (DEFAULT_LIMITS)
    for t in trials:
        damage, score = t.user_attrs["probe_result"]["damage"], t.user_attrs["score"]
        assert score["instability"] == pytest.approx(damage["value"])
        assert (damage["value"] == 0.0) == (not t.user_attrs["policy"]["rules"] and
                                             t.user_attrs["policy"]["default"] == "bf16")
        assert score["feasible"] == (damage["value"] <= limit and score["spikes"] + score["grad_blowups"] == 0)
        assert damage["measure"] == "update_norm"  # the default: batch-free, and it sees the memory knobs
    assert "update_norm" in log and "instability" in log


def test_mlflow_shows_the_reading_per_trial_and_per_unit(study):
    ws, _, units = study
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name(ws.experiment)
    trials = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("precsearch.role") != "study"]
    assert trials
    run = trials[0]
    per_unit = {k for k in run.data.metrics if k.startswith("damage_unit.")}
    assert "damage.grad_noise" in run.data.metrics and "damage" in run.data.metrics
    assert per_unit == {f"damage_unit.{u}" for u in units}
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"damage.md", "damage.json"} <= artifacts


def test_the_first_reading_of_each_clip_value_says_it_makes_the_bf16_side_and_times_it_apart(study):
    """The first trial of each clipping value pays the reading's BF16 side: the run says so at that trial, and its
    reading carries the side's seconds (``bf16_side_s``, which the ETA keeps out of the trial rate); the others
    carry 0."""
    import re

    ws, log, _ = study
    stored = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    ran = sorted((t for t in stored.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs),
                 key=lambda t: t.number)
    said = {int(n): clip for n, clip in
            re.findall(r"trial (\d+): its fixed-state reading first makes the BF16 side for clip_grad=(\S+) ", log)}
    clips = {}
    for t in ran:
        clips.setdefault(str(t.user_attrs["policy"]["clip_grad"]), t.number)
    assert said and sorted(said) == sorted(clips.values())
    for t in ran:
        side = t.user_attrs["probe_result"]["damage"]["bf16_side_s"]
        assert (side > 0) == (t.number in said), (t.number, side)


STANDARD_NOTICE = r"trial (\d+): reading the standard FP8 recipe for clip_grad=(\S+) at the same states"


def _standards(ws) -> dict[str, dict]:
    """The standard FP8 recipe's readings the study keeps (``references/standard-<key>.json``), by file name."""
    import json

    return {p.name: json.loads(p.read_text())["damage"] for p in ws.references_dir.glob("standard-*.json")}


def _scored(ws) -> list:
    stored = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    return sorted((t for t in stored.trials if t.state is TrialState.COMPLETE and "duplicate_of" not in t.user_attrs),
                  key=lambda t: t.number)


def test_each_trial_reads_as_a_multiple_of_the_standard_fp8_recipe_read_once(study):
    """Issue 53: the standard FP8 recipe (delayed scaling on every block Linear, BF16 output layer, the baseline's
    optimizer state) is read once for the study's one clip value, at the trials' states, and kept with the
    references; each trial's score carries its value and the trial's reading over it, which the trial line prints."""
    import re

    ws, log, _ = study
    assert len(re.findall(STANDARD_NOTICE, log)) == 1
    (standard,) = _standards(ws).values()
    # the CPU space trains FP32 parameters: the baseline keeps no master copy
    assert standard["recipe"] == "FP8 delayed scaling on every block Linear, BF16 output layer, FP32 weights and " \
        "moments"
    assert standard["value"] > 0 and standard["measure"] == "update_norm"
    trials = _scored(ws)
    assert [s["step"] for s in standard["states"]] == \
        [s["step"] for s in trials[0].user_attrs["probe_result"]["damage"]["states"]]  # the same states
    for t in trials:
        score = t.user_attrs["score"]
        assert score["instability_standard"] == standard["value"] and score["standard_recipe"] == standard["recipe"]
        assert score["instability_vs_standard"] == pytest.approx(score["damage"] / standard["value"], rel=1e-12)
    assert len(re.findall(r"\) = \S+x the standard FP8 recipe's \S+ \(FP8 delayed scaling", log)) == len(trials)
    # the front's line above the table restates the limit as a multiple of the standard recipe's reading
    from precsearch.search.front import trial_rows

    limit = trial_rows(optuna.load_study(study_name=ws.study_name, storage=ws.storage_url),
                       ["memory_saved", "instability"])[0]["instability_limit"]
    assert f"(the limit is {limit / standard['value']:.2g}x it)" in log, log[-3000:]
    client = MlflowClient(ws.tracking_uri)
    parent = next(r for r in client.search_runs([client.get_experiment_by_name(ws.experiment).experiment_id])
                  if r.data.tags.get("precsearch.role") == "study")
    assert float(parent.data.tags["instability_standard.clip_grad_1.0"]) == pytest.approx(standard["value"], rel=1e-2)
    assert parent.data.tags["standard_recipe"] == standard["recipe"]


def _damage_study(tmp, n_trials: int, **damage) -> tuple[Workspace, str]:
    data = tiny_space_dict(**{"objectives.reading": "damage", "objectives.damage.tokens_per_step": 4096,
                              "objectives.damage.states": [0.25, 1.0], "study.n_trials": 2,
                              **{f"objectives.damage.{k}": v for k, v in damage.items()}})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(write_space(tmp, data)), "--output-dir", str(tmp / "out"), "--no-progress",
                     "--n-trials", str(n_trials)]) == 0
    return Workspace.load(tmp / "out"), printed.getvalue()


def test_a_resumed_study_reads_the_standard_recipe_from_the_study_not_again(tmp_path):
    """The resumed run's probe process is a new one: it makes the BF16 side again, but the standard recipe's reading
    is the study's (references/), as the BF16 references are; its later trials are set beside the same one."""
    import re

    ws, first = _damage_study(tmp_path, 2)
    kept = _standards(ws)
    assert len(re.findall(STANDARD_NOTICE, first)) == 1 and len(kept) == 1
    (path,) = ws.references_dir.glob("standard-*.json")
    written = path.stat().st_mtime_ns
    ws, resumed = _damage_study(tmp_path, 3)
    assert re.findall(STANDARD_NOTICE, resumed) == [] and "the standard FP8 recipe's" in resumed
    assert _standards(ws) == kept and path.stat().st_mtime_ns == written
    (standard,) = kept.values()
    trials = _scored(ws)
    assert len(trials) >= 3
    assert {t.user_attrs["score"]["instability_standard"] for t in trials} == {standard["value"]}


def test_a_study_without_the_standard_reference_shows_no_multiple(tmp_path):
    """``objectives.damage.standard_reference: false``: no reading of it, nothing kept, no multiple in any trial's score
    or line, and ``precsearch front`` has no column for it."""
    import csv

    ws, log = _damage_study(tmp_path, 2, standard_reference=False)
    assert "standard FP8 recipe" not in log and _standards(ws) == {}
    for t in _scored(ws):
        score = t.user_attrs["score"]
        assert math.isnan(score["instability_vs_standard"]) and math.isnan(score["instability_standard"])
    with (ws.output_dir / "front" / "front.csv").open() as fh:
        assert "instability_vs_standard" not in next(csv.reader(fh))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["front", "--all", "--output-dir", str(ws.output_dir)]) == 0
    assert "vs standard" not in printed.getvalue() and "standard FP8" not in printed.getvalue()
