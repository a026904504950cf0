"""A soak finding states its figure as ``validate`` quotes it: gap ± SE, seeds, non-finite runs, and the worst
seed where one stands far out (a mean of +2.1% can hide a seed at +16%); a row that went non-finite is no finding.

What would be wrong if these failed: a refusal or a recipe's docs could quote a mean that hides a bad seed, or a
failed row could be carried as a pass.
"""

from __future__ import annotations

import pytest

from precsearch.soak import REFERENCE_ROW, SoakFinding


def test_the_figure_names_the_worst_seed_only_where_one_is_given():
    plain = SoakFinding("fp8_current", 0.35, 1.05, 8)
    outlier = SoakFinding("fp8_rowwise_emulated", 2.10, 2.12, 8, worst_pct=16.38)
    assert plain.figure() == "+0.35% ± 1.05%, 8 seeds, 0 non-finite"
    assert outlier.figure() == "+2.10% ± 2.12%, 8 seeds, 0 non-finite, worst seed +16.4%"
    assert outlier.cited().startswith("row fp8_rowwise_emulated: +2.10%") and "worst seed +16.4%" in outlier.cited()


def test_the_reference_row_is_the_pair_of_every_row():
    assert SoakFinding(REFERENCE_ROW, 0.0, 0.0, 8).figure().startswith("the pair of every row")


@pytest.mark.parametrize("kwargs", [{"non_finite": 1}, {"seeds": 0}, {"se_pct": -0.1}])
def test_a_row_that_did_not_pass_is_no_finding(kwargs):
    with pytest.raises(ValueError, match="soak row x"):
        SoakFinding(**{"row": "x", "gap_pct": 0.1, "se_pct": 0.2, "seeds": 8, **kwargs})
