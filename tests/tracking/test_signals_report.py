"""Early-warning signals as MLflow metrics, tags, a JSON artifact and a plot
(:mod:`precsearch.tracking.signals_report`)."""

from __future__ import annotations

import json
import math

import pytest

from precsearch.probe.measure.risk import risk_score
from precsearch.probe.measure.signals import Signals
from precsearch.tracking.signals_report import (
    SCALARS,
    save_signals_plot,
    signals_artifacts,
    signals_metrics,
    signals_tags,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _series(rate: float) -> dict[str, list[tuple[int, float]]]:
    steps = range(0, 201, 20)
    return {"amax": [(s, 2.0 * math.exp(rate * s / 100)) for s in steps],
            "kurtosis": [(s, 3.0 + rate * s / 50) for s in steps],
            "alignment": [(s, 0.02 + rate * s / 1000) for s in steps],
            "attention_logit": [(s, 5.0 + rate * s / 10) for s in steps],
            "grad_norm": [(s, 1.0 + 0.1 * math.sin(s)) for s in range(200)]}


POLICY = Signals(amax_growth=0.6, amax_growth_at="block.3.output", kurtosis=11.0, kurtosis_growth=0.5,
                 kurtosis_block=3, alignment=0.2, alignment_max=0.9, alignment_growth=0.09, alignment_block=3,
                 attention_logit=25.0, attention_logit_growth=10.0, attention_logit_block=0,
                 grad_norm_trend=math.nan, series=_series(1.0))
REFERENCE = Signals(amax_growth=0.1, amax_growth_at="block.0.output", kurtosis=3.5, kurtosis_growth=0.05,
                    alignment=0.02, alignment_max=0.1, alignment_growth=0.0, attention_logit=6.0,
                    attention_logit_growth=0.5, grad_norm_trend=-0.1, series=_series(0.1))


def test_metrics_hold_both_runs_and_the_risk():
    """A reviewer sorts trials by these: every measured signal, its reference, and the score must be there,
    with the values of the Signals and of risk_score (a NaN signal is left out, not logged as NaN)."""
    metrics = signals_metrics(POLICY, REFERENCE)
    assert metrics["signal_amax_growth"] == 0.6 and metrics["signal_ref_kurtosis"] == 3.5
    assert "signal_grad_norm_trend" not in metrics and metrics["signal_ref_grad_norm_trend"] == -0.1
    assert {f"signal_{n}" for n in SCALARS} - {"signal_grad_norm_trend"} <= set(metrics)
    risk = risk_score(POLICY, REFERENCE)
    assert metrics["risk_score"] == pytest.approx(risk.score) and risk.score > 0.99
    assert metrics["risk_kurtosis"] == pytest.approx((11.0 - 3.5) / 3.5)
    assert {k for k in metrics if k.startswith("risk_")} == {"risk_score"} | {f"risk_{n}" for n in risk.excess}


def test_metrics_without_a_reference_have_no_risk():
    metrics = signals_metrics(POLICY, None)
    assert "risk_score" not in metrics and not any(k.startswith("signal_ref_") for k in metrics)
    assert metrics["signal_attention_logit"] == 25.0


def test_tags_name_the_worst_tensor_and_the_missing_signals():
    assert signals_tags(POLICY, REFERENCE) == {"signal_amax_growth_at": "block.3.output",
                                                "risk_missing": "grad_norm_trend"}


def test_json_artifact_round_trips_both_runs():
    data = json.loads(signals_artifacts(POLICY, REFERENCE)["signals/signals.json"])
    # compared as JSON: NaN fields (signals not measured) are equal only as text
    assert json.dumps(Signals.from_dict(data["reference"]).to_dict()) == json.dumps(REFERENCE.to_dict())
    assert Signals.from_dict(data["policy"]).series == POLICY.series


@pytest.mark.parametrize("reference", [REFERENCE, None], ids=["with_reference", "alone"])
def test_plot_is_a_non_empty_png(tmp_path, reference):
    """Five panels of lines make a PNG of tens of kB; a blank or failed figure would be far smaller."""
    path = save_signals_plot(POLICY, reference, tmp_path / "signals" / "signals.png", title="trial 7")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000


def test_plot_of_a_run_with_no_signals_still_renders(tmp_path):
    """A BF16-only or diverged trial may have measured nothing: the plot must say so, not fail."""
    path = save_signals_plot(Signals(), None, tmp_path / "empty.png")
    assert path.read_bytes().startswith(PNG_MAGIC)
