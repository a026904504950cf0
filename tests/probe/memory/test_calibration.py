"""Calibrating the memory model from measured probes and extrapolating it to the target's depth."""

import dataclasses

import pytest
import torch

from precsearch.arch.units import unit_names
from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.precision import Precision
from precsearch.probe.memory.calibration import (
    Calibration,
    DepthMeasurement,
    fit_calibration,
    predict_target,
)
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.model.llama3 import PRESETS
from precsearch.probe.runner import backend_precisions, run_probe

WIDE = PRESETS["llama3-8b"]
SHAPE = dict(seq_len=4096, micro_batch=1, param_dtype="bf16")


def _fp8_blocks(cfg):
    return {n: Precision.FP8_CURRENT for n in unit_names(cfg) if n != "output_layer"}


def _measure(layers: int, fixed: int, per_layer: int) -> DepthMeasurement:
    """A synthetic GPU: the model's prediction plus costs it misses (``fixed + per_layer * layers``)."""
    cfg = WIDE.with_overrides(n_layers=layers)
    predicted = predict_peak(cfg, _fp8_blocks(cfg), **SHAPE).total
    return DepthMeasurement(layers, predicted, predicted + fixed + per_layer * layers)


def test_two_depths_separate_fixed_from_per_layer_costs_and_extrapolate_to_the_target():
    """Measured at 2 and 4 blocks, the fit recovers both missed costs, so the 32-block prediction is
    the truth to the byte; a fixed-only fit would miss 28 x per_layer bytes at 32 blocks."""
    fixed, per_layer = 300 * 2**20, 40 * 2**20
    cal = fit_calibration([_measure(2, fixed, per_layer), _measure(4, fixed, per_layer)])
    assert cal.fixed_bytes == pytest.approx(fixed) and cal.per_layer_bytes == pytest.approx(per_layer)
    target = predict_target(WIDE, _fp8_blocks(WIDE), cal, **SHAPE)
    assert target.bytes == _measure(32, fixed, per_layer).measured_bytes
    assert target.source == "calibrated" and cal.depths == (2, 4)


def test_one_depth_gives_a_fixed_offset_that_reproduces_its_measurement():
    point = _measure(4, 123_456_789, 0)
    cal = fit_calibration([point])
    assert (cal.fixed_bytes, cal.per_layer_bytes) == (123_456_789, 0.0)
    assert cal.correct(point.predicted_bytes, 4) == point.measured_bytes


def test_least_squares_over_noisy_depths():
    """Three depths with +-1 MiB of noise: the slope stays within the noise, not thrown off by one point."""
    points = [dataclasses.replace(p, measured_bytes=p.measured_bytes + noise)
              for p, noise in zip([_measure(n, 2**28, 2**24) for n in (1, 2, 4)], (2**20, -(2**20), 2**20))]
    cal = fit_calibration(points)
    assert abs(cal.per_layer_bytes - 2**24) < 2**20


def test_uncalibrated_is_the_model_as_is_and_labelled_predicted():
    target = predict_target(WIDE, {}, Calibration(), **SHAPE)
    assert target.bytes == predict_peak(WIDE, {}, **SHAPE).total and target.source == "predicted"


@pytest.mark.parametrize("points", [[], [DepthMeasurement(0, 10, 10)], [DepthMeasurement(2, 10, 0)]])
def test_unusable_measurements_are_refused(points):
    with pytest.raises(ValueError, match="calibration"):
        fit_calibration(points)


def test_probe_on_cpu_predicts_the_target_uncalibrated():
    """A CPU probe of 2 blocks reports the 4-block target's predicted peak, for the policy as named on
    the target (edge rules follow the target's depth), labelled predicted: nothing was measured."""
    probe_cfg, target = PRESETS["tiny"].with_overrides(n_layers=2), PRESETS["tiny"]
    probe = ProbeSection(steps=3, micro_batch=2, seq_len=32, lr_warmup_steps=0, device="cpu")
    data = TokenBatches(synthetic_tokens(20_000, 256, 0), seq_len=32, micro_batch=2, seed=0, eval_batches=1)
    policy = Policy(default=Precision.FP8_CURRENT)
    result = run_probe(probe_cfg, probe, policy, data, get_backend("emulated", torch.device("cpu")),
                       torch.device("cpu"), target=target)
    expected = predict_peak(target, backend_precisions(policy, target), seq_len=32, micro_batch=2)
    assert (result.target_layers, result.target_memory_source) == (4, "predicted")
    assert result.target_memory_bytes == expected.total > result.peak_memory_bytes
    assert result.memory_calibration["n_points"] == 0


def test_a_measured_probe_calibrates_its_target_prediction():
    """On a GPU the runner corrects the target by the probe's residual (a fixed offset from one depth);
    a probe stopped before its second step has no optimizer state in its peak and stays uncalibrated."""
    from precsearch.probe.result import ProbeResult
    from precsearch.probe.runner import _predict_target

    probe_cfg = WIDE.with_overrides(n_layers=4)
    probe = ProbeSection(steps=3, micro_batch=1, seq_len=4096, param_dtype="bf16", device="cpu")
    policy = Policy(rules=())
    predicted = predict_peak(probe_cfg, {}, **SHAPE).total
    measured = ProbeResult(losses=[3.0, 2.9, 2.8], memory_source="measured", peak_memory_bytes=predicted + 2**26)
    _predict_target(measured, probe_cfg, WIDE, probe, policy, predicted)
    assert measured.target_memory_bytes == predict_peak(WIDE, {}, **SHAPE).total + 2**26
    assert (measured.target_memory_source, measured.target_layers) == ("calibrated", 32)
    early = ProbeResult(losses=[float("nan")], memory_source="measured", peak_memory_bytes=predicted // 2)
    _predict_target(early, probe_cfg, WIDE, probe, policy, predicted)
    assert early.target_memory_source == "predicted"
