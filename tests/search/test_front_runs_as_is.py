"""The front names, per trial, the targets that run its policy as it is (issue 52, item 1).

A study without ``target:`` offers every choice; this column is how its user learns, before exporting, that
Megatron would drop a trial's warm-up or torchtitan its block-scaled layers. If these tests fail, the front
says a trial runs somewhere it does not (or hides where it does).
"""

from __future__ import annotations

import csv

from _spaces import tiny_space_dict, write_space
from _studies import one_trial_study
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.runtime.target_space import runs_as_is_of_space, runs_as_is_of_study, target_line
from precsearch.search.front import format_table, trial_rows
from precsearch.tracking.front_report import write_front

SCORE = {"memory_saved": 0.1, "instability": 0.0, "loss_gap": -0.001, "tokens_per_s": 100.0, "feasible": True,
         "stable": True, "diverged": False}
#: Delayed-scaling attention with a warm-up: only precsearch and Accelerate's precsearch path run it whole.
DELAYED = Policy(rules=(Rule("attention", ("*.self_attention.*",), Precision.FP8_DELAYED),), warmup_steps=4)
#: Tensorwise MLPs, head BF16, no warm-up: every target runs it.
PLAIN = Policy(rules=(Rule("mlp", ("*.mlp.*",), Precision.FP8_CURRENT),))


def _study(tmp_path, monkeypatch, policy: Policy, **overrides):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    space = parse_space(tiny_space_dict(**overrides))
    study, ws = one_trial_study(tmp_path, space, policy.to_dict(), SCORE, [0.1, 0.0])
    return study, ws, space


def test_each_row_names_the_targets_that_run_it(tmp_path, monkeypatch):
    study, _, _ = _study(tmp_path, monkeypatch, DELAYED)
    (row,) = runs_as_is_of_study(study, trial_rows(study, ["memory_saved", "instability"]))
    assert row["runs_as_is_in"] == "precsearch, accelerate"
    assert "[runs as-is in: precsearch, accelerate]" in format_table([row])


def test_a_plain_policy_runs_in_every_target(tmp_path, monkeypatch):
    study, _, _ = _study(tmp_path, monkeypatch, PLAIN)
    (row,) = runs_as_is_of_study(study, trial_rows(study, ["memory_saved", "instability"]))
    assert row["runs_as_is_in"] == "precsearch, megatron, torchtitan, accelerate"


def test_the_policy_rebuilt_from_params_gives_the_same_column():
    """``precsearch run`` prints its front from the params; ``precsearch front`` from the recorded policy."""
    space = parse_space(tiny_space_dict())
    rows = [{"trial": 0, "params": {"precision.attention": "fp8_delayed", "precision.mlp": "bf16",
                                    "warmup_steps": 4}}]
    assert runs_as_is_of_space(space, rows)[0]["runs_as_is_in"] == "precsearch, accelerate"


def test_front_csv_gets_the_column(tmp_path, monkeypatch):
    study, _, _ = _study(tmp_path, monkeypatch, PLAIN)
    rows = runs_as_is_of_study(study, trial_rows(study, ["memory_saved", "instability"]))
    write_front(rows, tmp_path / "front", 0.01)
    with (tmp_path / "front" / "front.csv").open() as fh:
        (written,) = list(csv.DictReader(fh))
    assert written["runs_as_is_in"] == "precsearch, megatron, torchtitan, accelerate"


def test_a_study_with_a_target_says_it_above_the_front(tmp_path, monkeypatch, capsys):
    study, ws, space = _study(tmp_path, monkeypatch, PLAIN, target={"name": "torchtitan"})
    line = target_line(study.user_attrs["space"])
    assert line.startswith("target: torchtitan 0.2.2 ")
    assert main(["front", "--output-dir", str(ws.output_dir)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == line and "[runs as-is in: precsearch, megatron, torchtitan, accelerate]" in out


def test_a_study_without_a_target_has_no_target_line(tmp_path, monkeypatch):
    study, _, _ = _study(tmp_path, monkeypatch, PLAIN)
    assert target_line(study.user_attrs["space"]) is None


def test_the_export_names_the_studys_target(tmp_path, monkeypatch):
    from precsearch.runtime.study_export import export

    study, ws, _ = _study(tmp_path, monkeypatch, PLAIN, target={"name": "megatron"})
    written = export(study, ws, trial=0, fmt="megatron")
    assert "# searched for target megatron core_v0.16.0\n" in written.files["megatron_args.sh"]
    assert not any("searched for target" in w for w in written.warnings)
    elsewhere = export(study, ws, trial=0, fmt="torchtitan")
    assert any("checked against megatron, not torchtitan" in w for w in elsewhere.warnings), elsewhere.warnings


def test_mlflow_tags_each_trial_run_with_the_targets(tmp_path, monkeypatch):
    """The front's column reaches each trial's MLflow run as the tag ``runs_as_is_in``."""
    from mlflow.tracking import MlflowClient

    from precsearch.tracking import Tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "exp", tmp_path / "art", "s")
    run_id = tracker.start_trial(0, {"attention": "fp8_delayed"})
    tracker.set_pareto({0: run_id}, front={0}, extra={0: {"runs_as_is_in": "precsearch, accelerate"}})
    tags = MlflowClient(uri).get_run(run_id).data.tags
    assert tags["runs_as_is_in"] == "precsearch, accelerate" and tags["pareto"] == "true"


def test_a_study_with_a_target_shows_what_the_target_saves(tmp_path, monkeypatch, capsys):
    study, ws, _ = _study(tmp_path, monkeypatch, PLAIN, target={"name": "megatron"})
    (row,) = runs_as_is_of_study(study, trial_rows(study, ["memory_saved", "instability"]))
    assert isinstance(row["target_memory_saved"], float)
    assert main(["front", "--output-dir", str(ws.output_dir)]) == 0
    assert f"[target: memory saved {100 * row['target_memory_saved']:.2f}% predicted]" in capsys.readouterr().out


def test_precsearch_as_a_target_saves_what_the_export_predicts_for_the_trial():
    """The precsearch target runs the policy as the probe did: the same memory model figure as the export's."""
    from precsearch.export.as_run import as_searched
    from precsearch.runtime.export_cost import export_cost
    from precsearch.runtime.target_memory import target_memory_saved

    space = parse_space(tiny_space_dict()).model_dump(mode="json")
    n_layers = parse_space(tiny_space_dict()).model.target().n_layers
    trial = as_searched(PLAIN, n_layers)
    cost = export_cost(space, trial, trial, n_layers)
    assert target_memory_saved(space, "precsearch", PLAIN) == cost.saved(cost.trial_bytes)


def test_a_target_that_drops_the_memory_knobs_saves_less():
    """torchtitan keeps AdamW's states in the parameters' dtype: BF16 moments save nothing there."""
    from precsearch.policy.rules import MemoryKnobs
    from precsearch.runtime.target_memory import target_memory_saved

    space = parse_space(tiny_space_dict()).model_dump(mode="json")
    knobs = Policy(rules=PLAIN.rules, memory=MemoryKnobs(moment_dtype="bf16"))
    assert target_memory_saved(space, "torchtitan", knobs) == target_memory_saved(space, "torchtitan", PLAIN)
    assert target_memory_saved(space, "precsearch", knobs) > target_memory_saved(space, "precsearch", PLAIN)
