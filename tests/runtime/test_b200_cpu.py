"""The B200 space's CPU variant runs end to end, emulated: per-module FP8 current / MXFP8 and BF16 edge blocks,
through the CLI, with the note that speed and memory are not a B200's; and a space that adds NVFP4 with its
switches runs too where NVFP4 is taken as unsoaked (the soak refuses it: tests/config/test_soak_checks.py)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from _spaces import write_space
from precsearch.cli import main
from precsearch.runtime.workspace import Workspace
from precsearch.utils.yaml_io import load_yaml

SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "b200_cpu.yaml"


def _done(out: Path) -> list[optuna.trial.FrozenTrial]:
    ws = Workspace.load(out)
    study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    done = [t for t in study.trials if t.state is TrialState.COMPLETE]
    assert all(all(v == v for v in t.values) for t in done)  # scored, no NaN objective
    return done


@pytest.mark.slow
def test_b200_cpu_space_runs_emulated_end_to_end(tmp_path, capsys):
    """Two trials (random sampler, seed 3) must finish and be scored, with no soak warning (what it offers
    passed); a refusal, a crash in the MXFP8 path or a missing note would fail here."""
    assert main(["run", str(SPACE), "--output-dir", str(tmp_path), "--n-trials", "2", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "mxfp8 run emulated" in err and "not a B200's" in err
    assert "no long run has passed" not in err and "allow_unsoaked" not in err, err
    done = _done(tmp_path)
    assert len(done) == 2
    assert any("mxfp8" in t.params.values() for t in done)
    assert {"bf16_blocks.first", "bf16_blocks.last"} <= set(done[0].params)


@pytest.mark.slow
def test_nvfp4_and_its_switches_run_in_a_study_where_it_is_offered(tmp_path, capsys, unsoaked_nvfp4):
    data = load_yaml(SPACE)
    for group in data["search"]["groups"]:
        group["precision"] = {"choices": ["bf16", "fp8_current", "mxfp8", "nvfp4"]}
    data["search"]["recipe"] = {"nvfp4_rht": {"choices": [True, False]},
                                "nvfp4_2d_weights": {"choices": [True, False]},
                                "nvfp4_stochastic_rounding": {"choices": [True, False]}}
    data["search"]["allow_unsoaked"] = True
    space = write_space(tmp_path, data, "b200_nvfp4.yaml")
    out = tmp_path / "out"
    assert main(["run", str(space), "--output-dir", str(out), "--n-trials", "2", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "mxfp8 and nvfp4 run emulated" in err, err
    soak = [line for line in err.splitlines() if line.startswith("warning: ") and "no long run has passed" in line]
    assert [("'mxfp8'" in w, "'nvfp4'" in w) for w in soak] == [(False, True)], err
    done = _done(out)
    assert len(done) == 2 and any("nvfp4" in t.params.values() for t in done)
    assert {"bf16_blocks.first", "bf16_blocks.last", "recipe.nvfp4_rht"} <= set(done[0].params)
