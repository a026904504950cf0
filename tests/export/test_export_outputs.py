"""Where export writes, and what it says about the trial it writes (issue 16, "Exports").

``-o DIR/`` for a one-file format wrote a *file* named DIR (``Path`` drops the trailing slash);
``--trial N`` of an infeasible trial gave no warning, so a policy that trained 11% worse than BF16
could be exported as if it had passed.
"""

from __future__ import annotations

import optuna
import pytest

from _spaces import tiny_space_dict
from precsearch.cli import build_parser
from precsearch.config.loader import parse_space
from precsearch.export.policy_export import write_export
from precsearch.runtime.study_export import export
from precsearch.policy import Policy
from precsearch.runtime.workspace import Workspace

WS = Workspace(output_dir=None, study_name="fake", storage_url="", tracking_uri="", experiment="")


def test_a_trailing_slash_means_a_directory_even_when_it_does_not_exist(tmp_path):
    out = f"{tmp_path}/torchtitan/"
    assert build_parser().parse_args(["export", "--trial", "0", "-o", out]).output == out  # kept as written
    written = write_export({"torchtitan.toml": "[model]\n"}, out)
    assert written == [tmp_path / "torchtitan" / "torchtitan.toml"]
    assert (tmp_path / "torchtitan").is_dir() and written[0].read_text() == "[model]\n"
    assert write_export({"p.yaml": "x"}, str(tmp_path / "plain.yaml")) == [tmp_path / "plain.yaml"]  # no slash: a file


def _study(score: dict, **objectives) -> optuna.Study:
    space = parse_space(tiny_space_dict(objectives=objectives or None) if objectives else tiny_space_dict())
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("objectives", ["memory_saved", "instability"])
    study.set_user_attr("space", space.model_dump(mode="json"))
    base = {"memory_saved": 0.3, "loss_gap": score.get("instability", 0.0), "tokens_per_s": 100.0,
            "diverged": False, "noise_floor": 0.05}
    study.add_trial(optuna.trial.create_trial(values=[0.3, score.get("instability", 0.0)], params={},
                                              distributions={}, user_attrs={"policy": Policy().to_dict(),
                                                                            "score": base | score}))
    return study


@pytest.mark.parametrize("score, objectives, fragments", [
    ({"instability": 0.11, "stable": False, "feasible": False}, {},
     ["trial 0 is not feasible",
      "instability 0.11 fraction of the BF16 loss; limit 0.01: unstable (objectives.stability_limit)"]),
    ({"instability": 0.15, "stable": False, "feasible": False}, {"stability_unit": "noise", "reference_seeds": 2},
     ["instability 3 BF16 seed spreads; limit 2: unstable (objectives.stability_limit)"]),
    ({"instability": 1.0, "stable": False, "feasible": False, "diverged": True}, {}, ["trial 0 diverged"]),
    ({"instability": 0.0, "stable": True, "feasible": False}, {}, ["not under stress"]),
], ids=["relative", "noise", "diverged", "stress"])
def test_exporting_an_infeasible_trial_by_number_warns_why(score, objectives, fragments):
    warnings = export(_study(score, **objectives), WS, trial=0).warnings
    assert any(all(f in w for f in fragments) for w in warnings), warnings


def test_a_feasible_trial_exports_without_that_warning():
    warnings = export(_study({"instability": 0.004, "stable": True, "feasible": True}), WS, trial=0).warnings
    assert not any("feasible" in w or "diverged" in w for w in warnings), warnings
