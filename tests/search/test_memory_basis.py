"""``objectives.memory_basis``: the memory objective is the target's (default) or the probe's saving."""

import math

import pydantic
import pytest

from precsearch.config.space import ObjectivesSection
from precsearch.probe.result import ProbeResult
from precsearch.search.scoring import objective_values, score


def _result(probe_peak: int, target_peak: int) -> ProbeResult:
    return ProbeResult(losses=[3.0, 2.5], eval_loss=2.0, peak_memory_bytes=probe_peak,
                       target_memory_bytes=target_peak, tokens_per_s=1.0)


# A 4-block probe where FP8 weight copies cost more than they save, whose 32-block target saves:
# the two bases must disagree in sign, so a mixed-up basis cannot pass.
POLICY, REFERENCE = _result(1100, 700), _result(1000, 1000)


def test_default_basis_is_the_target_and_both_figures_are_reported():
    s = score(POLICY, REFERENCE, ObjectivesSection())
    assert math.isclose(s.memory_saved_probe, -0.1) and math.isclose(s.memory_saved_target, 0.3)
    assert s.memory_saved == s.memory_saved_target
    assert objective_values(s, ObjectivesSection())[0] == s.memory_saved_target


def test_probe_basis_optimises_the_probes_saving():
    s = score(POLICY, REFERENCE, ObjectivesSection(memory_basis="probe"))
    assert s.memory_saved == s.memory_saved_probe == pytest.approx(-0.1)


def test_a_result_without_a_target_prediction_cannot_be_scored_on_the_target():
    """A result stored before target predictions existed: refused with what to do, never read as 0%."""
    old = _result(900, 0)
    with pytest.raises(ValueError, match="memory_basis: probe"):
        score(old, REFERENCE, ObjectivesSection())
    s = score(old, REFERENCE, ObjectivesSection(memory_basis="probe"))
    assert s.memory_saved == pytest.approx(0.1) and math.isnan(s.memory_saved_target)


def test_an_unknown_basis_names_the_field():
    with pytest.raises(pydantic.ValidationError, match="memory_basis"):
        ObjectivesSection(memory_basis="gpu")
