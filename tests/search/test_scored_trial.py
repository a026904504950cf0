"""A trial's scored record (:mod:`precsearch.search.scored_trial`): made once, stored in the layout every
earlier version stored, and read back whole without scoring the probe again."""

from __future__ import annotations

import json
import math

from precsearch.config.space import ObjectivesSection
from precsearch.probe.result import ProbeResult
from precsearch.search.scored_trial import ScoredTrial, score_trial
from precsearch.search.scoring import Score, objective_values, score, stability_metrics, verdict_line


def _result(eval_loss: float, peak: int) -> ProbeResult:
    return ProbeResult(losses=[4.0, 3.0, 2.5, 2.0], eval_loss=eval_loss, peak_memory_bytes=peak,
                       target_memory_bytes=peak * 10, tokens_per_s=100.0)


def _scored() -> tuple[ScoredTrial, ObjectivesSection]:
    objectives = ObjectivesSection(spike_penalty=0.0)
    return score_trial(_result(2.02, 800), _result(2.0, 1000), objectives, noise_floor=0.01), objectives


def test_the_record_holds_what_scoring_gives_every_output():
    """Values, verdict and metrics are those of the score: else Optuna, the terminal and MLflow would disagree."""
    scored, objectives = _scored()
    s = score(_result(2.02, 800), _result(2.0, 1000), objectives, noise_floor=0.01)
    assert scored.score == s
    assert list(scored.values) == objective_values(s, objectives)
    assert scored.verdict == verdict_line(s, objectives) and dict(scored.stability) == stability_metrics(s)
    assert scored.constraint == s.constraint and scored.to_dict() == s.to_dict()


def test_the_stored_record_reads_back_equal_through_json():
    """A told trial's user attribute ``score`` (JSON in the storage, NaNs included) gives the same record: the
    recorder writes the MLflow run from it, so the run's verdict and metrics are the terminal's."""
    scored, objectives = _scored()
    stored = json.loads(json.dumps(scored.to_dict()))
    again = ScoredTrial.from_stored(stored, objectives)
    assert again.verdict == scored.verdict and again.values == scored.values
    assert math.isnan(again.score.damage) and again.score.memory_saved == scored.score.memory_saved


def test_a_score_stored_before_later_fields_still_loads():
    """A study stored by an earlier version lacks the fields added since (they have defaults): it must still
    load and resume; a field it does not know (a later version's) is left out."""
    scored, objectives = _scored()
    old = {k: v for k, v in scored.to_dict().items() if k not in ("nonfinite", "stress_nonfinite", "damage_measure")}
    assert Score.from_dict(old | {"from_the_future": 1.0}).nonfinite == ""
    assert ScoredTrial.from_stored(old, objectives).values == scored.values
