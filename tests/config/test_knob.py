"""Knobs: fixed values, choices and ranges parse, validate and propose values to Optuna."""

import optuna
import pytest
from pydantic import BaseModel, ValidationError

from precsearch.config.knob import Knob, knob
from precsearch.precision import Precision


class _M(BaseModel):
    p: knob(Precision) = Knob(fixed=Precision.BF16)
    n: knob(int, numeric=True) = Knob(fixed=0)
    c: knob(float | None, numeric=True) = Knob(fixed=None)


def test_fixed_choice_and_range_parse():
    """The three spellings give the three knob kinds, with typed values (enums, not strings)."""
    m = _M(p={"choices": ["bf16", "fp8_current"]}, n={"low": 0, "high": 20, "step": 5}, c=1.0)
    assert m.p.choices == (Precision.BF16, Precision.FP8_CURRENT)
    assert (m.n.low, m.n.high, m.n.step) == (0, 20, 5)
    assert m.c.is_fixed and m.c.fixed == 1.0


@pytest.mark.parametrize("bad, fragment", [
    ({"p": {"choices": []}}, "non-empty"),
    ({"p": {"choices": ["fp9"]}}, "fp8_delayed"),  # the error lists what is valid
    ({"p": {"low": 1, "high": 2}}, "not a range"),
    ({"n": {"low": 5, "high": 1}}, "low <= high"),
    ({"n": {"low": 1}}, "both 'low' and 'high'"),
    ({"n": {"choices": [1, 1]}}, "duplicates"),
    ({"n": {"low": 1, "high": 4, "stride": 2}}, "unknown key"),
])
def test_bad_knobs_are_refused_with_a_reason(bad, fragment):
    """Malformed knobs must fail validation with a message saying what is wrong."""
    with pytest.raises(ValidationError) as info:
        _M(**bad)
    assert fragment in str(info.value)


def test_suggest_round_trips_through_optuna():
    """Values proposed to a trial come back typed; fixed knobs make no Optuna param."""
    m = _M(p={"choices": ["bf16", "fp8_current"]}, n={"low": 0, "high": 20, "step": 5},
           c={"choices": [None, 1.0]})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    p, n, c = m.p.suggest(trial, "p"), m.n.suggest(trial, "n"), m.c.suggest(trial, "c")
    assert isinstance(p, Precision) and n in (0, 5, 10, 15, 20) and c in (None, 1.0)
    assert set(trial.params) == {"p", "n", "c"}
    assert _M().p.suggest(study.ask(), "x") is Precision.BF16
    fixed = optuna.trial.FixedTrial({"p": "fp8_current", "n": 5, "c": None})
    assert m.p.suggest(fixed, "p") is Precision.FP8_CURRENT
