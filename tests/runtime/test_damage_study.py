"""A whole study read by the fixed-state reading (``objectives.reading: damage``), through the CLI.

What would be wrong if these failed: the reading does not reach the trials (the probe process does not read
it, or the result loses it on the way), the score ignores it, or MLflow does not show it per trial and unit.
"""

from __future__ import annotations

import contextlib
import io

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
