"""The regime check reads a BF16 reference's events and signals and flags a run at the edge of stability.

If these fail, a study would start its trials on a BF16 yardstick that spikes or whose attention logits or
block amax run away (and every loss gap would score that instability), or it would warn about a smooth one.
"""

from __future__ import annotations

import pytest

from precsearch.config.space import ObjectivesSection, ProbeSection, Space
from precsearch.errors import UserError
from precsearch.probe.regime import BLOCK_AMAX_FLOOR, MAX_ATTENTION_LOGIT, MAX_BLOCK_AMAX_GROWTH, check_regime
from precsearch.probe.result import ProbeResult
from precsearch.probe.measure.signals import Signals
from precsearch.runtime.regime_gate import gate_regime

STEPS = (0, 10, 20, 30, 39)


def _reference(logits=(2.0, 6.0, 9.0, 11.0, 12.0), amax=(13.0, 14.0, 16.0, 17.0, 18.0),
               events=()) -> ProbeResult:
    """A 40-step BF16 reference whose signals and events are what the arguments say."""
    signals = Signals(block_amax_at="block.0.output",
                      series={"attention_logit": list(zip(STEPS, logits)), "block_amax": list(zip(STEPS, amax))})
    return ProbeResult(losses=[5.0 - 0.05 * s for s in range(40)], grad_norms=[1.0] * 40,
                       events=[dict(e) for e in events], signals=signals.to_dict())


SPIKE = {"step": 17, "kind": "loss_spike", "value": 6.1, "baseline": 4.2}


def test_a_smooth_reference_passes():
    verdict = check_regime([_reference(), _reference(logits=(2.0, 5.0, 8.0, 10.0, 14.0))], [0, 1])
    assert verdict.smooth and verdict.findings == ()


def test_a_spiking_reference_is_flagged_naming_the_spike_and_its_seed():
    verdict = check_regime([_reference(), _reference(events=[SPIKE])], [0, 1])
    assert not verdict.smooth
    (finding,) = verdict.findings
    assert (finding.seed, finding.signal) == (1, "loss_spike")
    assert "step 17" in finding.evidence and "6.1 against 4.2" in finding.evidence


def test_a_runaway_attention_logit_is_flagged_with_its_peak_and_step():
    verdict = check_regime([_reference(logits=(2.0, 40.0, 300.0, 1012.0, 900.0))], [0])
    (finding,) = verdict.findings
    assert finding.signal == "attention_logit"
    assert finding.evidence == f"max attention logit 1012 at step 30 (limit {MAX_ATTENTION_LOGIT:g})"


def test_a_runaway_block_amax_is_flagged_from_first_to_peak():
    """The 8B space's reading (13 -> 7296) is flagged; a 10x growth is not, nor a small init growing 100x
    to its working scale (the quickstart's 0.2 -> 21), nor a checkpoint's massive activations as such."""
    flagged = check_regime([_reference(amax=(13.0, 80.0, 900.0, 4000.0, 7296.0))], [0])
    (finding,) = flagged.findings
    assert finding.signal == "block_amax" and "13 -> 7296" in finding.evidence and "x561" in finding.evidence
    assert check_regime([_reference(amax=(13.0, 30.0, 60.0, 100.0, 130.0))], [0]).smooth
    assert check_regime([_reference(amax=(0.204, 2.0, 8.0, 15.0, 20.78))], [0]).smooth
    assert check_regime([_reference(amax=(2500.0, 2600.0, 2700.0, 2800.0, 3000.0))], [0]).smooth
    assert 130 / 13 < MAX_BLOCK_AMAX_GROWTH < 7296 / 13 and 20.78 < BLOCK_AMAX_FLOOR < 7296


def test_gradient_blowups_and_several_signals_are_all_reported():
    blowup = {"step": 21, "kind": "grad_blowup", "value": 55.0, "baseline": 2.0}
    verdict = check_regime([_reference(logits=(1, 2, 3, 4, 400.0), events=[SPIKE, blowup])], [0])
    assert [f.signal for f in verdict.findings] == ["loss_spike", "grad_blowup", "attention_logit"]


def _space(mode: str) -> Space:
    return Space(probe=ProbeSection(device="cpu", lr=1e-3, lr_warmup_steps=5, micro_batch=1, seq_len=4096),
                 objectives=ObjectivesSection(regime_check=mode))


def test_the_gate_warns_naming_the_fields_to_change_and_the_evidence():
    said = []
    verdict = gate_regime(_space("warn"), [_reference(events=[SPIKE])], "clip_grad 1.0, 40 steps", said.append)
    assert not verdict.smooth
    (message,) = said
    for needed in ("probe.lr (now 0.001", "probe.lr_warmup_steps (now 5)", "probe.grad_accum (now 1)",
                   "probe.micro_batch (now 4,096 tokens", "seed 0: 1 loss spike at step 17 (6.1 against 4.2)",
                   "objectives.regime_check"):
        assert needed in message


def test_the_gate_refuses_with_a_user_error_or_stays_quiet_when_off_or_smooth():
    said = []
    with pytest.raises(UserError) as raised:
        gate_regime(_space("refuse"), [_reference(events=[SPIKE])], "clip_grad 1.0, 40 steps", said.append)
    assert raised.value.field == "probe.lr" and "loss spike" in str(raised.value)
    assert gate_regime(_space("off"), [_reference(events=[SPIKE])], "x", said.append) is None
    assert gate_regime(_space("refuse"), [_reference()], "x", said.append).smooth
    assert said == []


def test_regime_check_choices_are_validated():
    with pytest.raises(ValueError, match="warn"):
        ObjectivesSection(regime_check="loud")


def test_a_short_probe_still_reports_its_runaway_block_from_the_recorded_history():
    """30 steps leave too few tail stat steps for amax_growth's trend fit; the whole-run growth is still read,
    for the block that grew most (not the first block, not the largest amax)."""
    from precsearch.probe.measure.signals import summarise

    history = {"amax": {"block.0.output": {0: 40.0, 10: 50.0, 20: 60.0, 29: 80.0},
                        "block.1.output": {0: 13.0, 10: 200.0, 20: 3000.0, 29: 7296.0}}}
    signals = summarise(history)
    assert signals.block_amax_at == "block.1.output" and signals.amax_growth_at == ""
    (finding,) = check_regime([ProbeResult(signals=signals.to_dict())], [0]).findings
    assert finding.evidence.startswith("block.1.output amax 13 -> 7296 by step 29")
