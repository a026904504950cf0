"""FP8 diagnostics as MLflow metrics, tags and artifacts (:mod:`precsearch.tracking.diagnostics_report`)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from _spaces import tiny_space_dict, write_space
from mlflow.tracking import MlflowClient

from precsearch.cli import main
from precsearch.probe.measure.diagnostics import FirstBad
from precsearch.probe.result import ProbeResult
from precsearch.runtime.workspace import Workspace
from precsearch.tracking import Tracker
from precsearch.tracking.diagnostics_report import (
    COLUMNS,
    diagnostics_artifacts,
    diagnostics_heatmap,
    diagnostics_metrics,
    diagnostics_tags,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(step: int, layer: str, role: str, overflow: float, underflow: float = 0.0) -> dict:
    return {"step": step, "layer": layer, "role": role, "precision": "fp8_delayed", "amax": 2.0,
            "scale": 224.0, "overflow": overflow, "underflow": underflow, "nonfinite": 0}


@pytest.fixture
def result() -> ProbeResult:
    rows = [_row(0, "a", "input", 0.0, 0.2), _row(0, "a", "weight", 0.0), _row(0, "b", "grad_output", 0.0),
            _row(1, "a", "input", 0.003), _row(1, "a", "weight", 0.9), _row(1, "b", "grad_output", 0.0005)]
    bad = FirstBad(1, "a", "input", "overflow", 0.003)
    return ProbeResult(diverged=True, layer_stats=rows, first_bad=bad.to_dict())


def test_metrics_summarise_the_worst_operand(result):
    """A reviewer sorts trials by these: the max must be over every layer, role and step."""
    metrics = diagnostics_metrics(result)
    assert metrics == {"fp8_max_overflow": 0.9, "fp8_max_underflow": 0.2, "fp8_layers_saturating": 1.0,
                       "fp8_nonfinite": 0.0}
    assert diagnostics_metrics(result, limit=0.0001)["fp8_layers_saturating"] == 2.0


def test_tags_say_where_and_what_went_bad_first(result):
    tags = diagnostics_tags(result)
    assert tags["fp8_max_overflow_at"] == "a weight step 1"
    assert tags["first_bad"] == "first bad layer a: 0.30% of input saturated at step 1"


def test_csv_holds_every_row(result):
    text = diagnostics_artifacts(result)["diagnostics/layer_stats.csv"]
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0]) == COLUMNS and len(rows) == len(result.layer_stats)
    assert float(rows[4]["overflow"]) == 0.9


def test_heatmap_is_a_png(result):
    png = diagnostics_heatmap(result)
    assert png is not None and png.startswith(PNG_MAGIC)


def test_no_fp8_gives_nothing():
    """A BF16 trial must not get zero-valued FP8 metrics that look like a clean FP8 run."""
    empty = ProbeResult()
    assert diagnostics_metrics(empty) == {} and diagnostics_tags(empty) == {}
    assert diagnostics_artifacts(empty) == {} and diagnostics_heatmap(empty) is None


def test_tracker_logs_binary_artifacts(tmp_path: Path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", tmp_path / "art", "s")
    run_id = tracker.start_trial(0, {})
    tracker.log_bytes(run_id, PNG_MAGIC + b"rest", "diagnostics/heatmap.png")
    client = MlflowClient(tracker.uri)
    assert [a.path for a in client.list_artifacts(run_id, "diagnostics")] == ["diagnostics/heatmap.png"]
    local = client.download_artifacts(run_id, "diagnostics/heatmap.png", str(tmp_path))
    assert Path(local).read_bytes() == PNG_MAGIC + b"rest"


def test_a_study_trial_carries_its_diagnostics(tmp_path: Path):
    """The wiring in study._record: an FP8 trial's run has the metrics, the tag, the CSV and the heatmap."""
    space = tiny_space_dict(**{"search.groups": [{"name": "all", "modules": ["*"], "precision": "fp8_delayed"}],
                               "search.warmup_steps": 0, "study.n_trials": 1, "probe.steps": 6})
    assert main(["run", str(write_space(tmp_path, space)), "--output-dir", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    ws = Workspace.load(tmp_path / "out")
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name(ws.experiment)
    trial = next(r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("precsearch.role") == "trial")
    assert {"fp8_max_overflow", "fp8_max_underflow", "fp8_layers_saturating", "fp8_max_input_crest"} <= set(
        trial.data.metrics)
    assert trial.data.metrics["fp8_max_input_crest"] >= 1.0  # amax is never below the RMS
    assert "fp8_max_overflow_at" in trial.data.tags and "fp8_max_input_crest_at" in trial.data.tags
    paths = {a.path for a in client.list_artifacts(trial.info.run_id, "diagnostics")}
    assert paths == {"diagnostics/layer_stats.csv", "diagnostics/heatmap.png"}


def test_the_largest_input_crest_names_its_layer_and_step():
    """Issue 55: a trained model's massive activations (SmolLM2: one residual channel ~25k against a median of 2)
    show as an FP8 input's amax far above its RMS; the run carries the largest and where it was."""
    rows = [dict(_row(0, "a", "input", 0.0), amax=8.0, rms=2.0), dict(_row(0, "b", "input", 0.0), amax=600.0, rms=1.5),
            dict(_row(9, "b", "input", 0.0), amax=900.0, rms=1.5), dict(_row(9, "b", "weight", 0.0), amax=5e3, rms=0.1),
            dict(_row(9, "c", "input", 0.0), amax=1.0, rms=0.0)]  # no RMS: no crest, not an error
    result = ProbeResult(layer_stats=rows)
    assert diagnostics_metrics(result)["fp8_max_input_crest"] == 600.0  # weights are not inputs
    assert diagnostics_tags(result)["fp8_max_input_crest_at"] == "b step 9"
    table = list(csv.DictReader(io.StringIO(diagnostics_artifacts(result)["diagnostics/layer_stats.csv"])))
    assert [float(r["crest"]) for r in table[:3]] == [4.0, 400.0, 600.0] and table[4]["crest"] == "nan"


def test_a_backend_reports_each_operands_rms():
    """The emulated cast's statistics carry the operand's RMS beside its amax (what the crest is made of)."""
    import torch

    from precsearch.backends.tensor_stats import TensorStats
    from precsearch.fp8.formats import quantization_stats

    x = torch.tensor([3.0, -4.0, 0.0, 0.0])
    stats = TensorStats.from_quantization(quantization_stats(x, 1.0, "e4m3"), x.numel())
    assert stats.amax == 4.0 and stats.rms == pytest.approx(2.5)
