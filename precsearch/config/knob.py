"""Knobs: a setting that is either fixed or searched.

In a space file every searchable setting is written one of three ways::

    margin: 0                              # fixed
    amax_history_len: {choices: [16, 1024]}  # categorical
    warmup_steps: {low: 0, high: 20, step: 5}  # integer or float range (log: true for log scale)

:func:`knob` builds the pydantic type for a knob over values of one type, so the
space model validates every choice and bound with the same rules as a fixed
value. A parsed knob proposes its value to an Optuna trial with :meth:`Knob.suggest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any

import optuna
from pydantic import BeforeValidator, PlainSerializer, TypeAdapter

from precsearch.utils.numbers import number_problem

_RANGE_KEYS = {"low", "high", "step", "log"}


@dataclass(frozen=True)
class Knob:
    """A fixed value, a list of choices, or a numeric range."""

    fixed: Any = None
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False

    @property
    def is_fixed(self) -> bool:
        return self.choices is None and self.low is None

    def options(self) -> list[Any]:
        """Every value the knob can take (ranges: the two ends)."""
        if self.choices is not None:
            return list(self.choices)
        if self.low is not None:
            return [self.low, self.high]
        return [self.fixed]

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        """The value for this trial: fixed values are returned without a trial param."""
        if self.choices is not None:
            raw = trial.suggest_categorical(name, [_plain(c) for c in self.choices])
            return next(c for c in self.choices if _plain(c) == raw)
        if self.low is None:
            return self.fixed
        if isinstance(self.low, int) and isinstance(self.high, int) and not isinstance(self.step, float):
            return trial.suggest_int(name, self.low, self.high, step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)

    def from_param(self, raw: Any) -> Any:
        """Map a stored Optuna param value back to the knob's typed value."""
        if self.choices is not None:
            return next((c for c in self.choices if _plain(c) == raw), raw)
        return raw

    def to_data(self) -> Any:
        """The form a space file would write."""
        if self.choices is not None:
            return {"choices": [_plain(c) for c in self.choices]}
        if self.low is not None:
            data = {"low": self.low, "high": self.high, "log": self.log}
            return data | ({"step": self.step} if self.step is not None else {})
        return _plain(self.fixed)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


@dataclass(frozen=True)
class KnobValues:
    """Marks a knob field with the type of its values (read by tests that walk the space's fields)."""

    value_type: Any
    numeric: bool


def _parser(value_type: Any, numeric: bool):
    adapter = TypeAdapter(value_type)

    def parse(raw: Any) -> Knob:
        if isinstance(raw, Knob):
            return raw
        if numeric:
            _refuse_non_numbers(_raw_values(raw))  # a bool would be read as 0 or 1
        if isinstance(raw, dict) and "choices" in raw:
            parsed = _parse_choices(raw, adapter)
        elif isinstance(raw, dict) and raw.keys() & _RANGE_KEYS:
            if not numeric:
                raise ValueError("this setting takes a value or {choices: [...]}, not a range")
            parsed = _parse_range(raw, adapter)
        else:
            parsed = Knob(fixed=adapter.validate_python(raw))
        if numeric:
            _refuse_non_numbers(parsed.options())  # "inf" or "nan" written as a string parses to one
        return parsed

    return parse


def _raw_values(raw: Any) -> list[Any]:
    if not isinstance(raw, dict):
        return [raw]
    choices = raw.get("choices")
    return (list(choices) if isinstance(choices, list) else []) + [raw.get("low"), raw.get("high")]


def _refuse_non_numbers(values: list[Any]) -> None:
    for value in values:
        if (problem := number_problem(value)) is not None:
            raise ValueError(problem)


def _parse_choices(raw: dict, adapter: TypeAdapter) -> Knob:
    extra = set(raw) - {"choices"}
    if extra:
        raise ValueError(f"unknown key(s) {sorted(map(str, extra))} beside 'choices'")
    choices = raw["choices"]
    if not isinstance(choices, list) or not choices:
        raise ValueError("'choices' must be a non-empty list")
    values = tuple(adapter.validate_python(c) for c in choices)
    if len(set(map(_plain, values))) != len(values):
        raise ValueError(f"'choices' has duplicates: {[_plain(v) for v in values]}")
    return Knob(choices=values)


def _parse_range(raw: dict, adapter: TypeAdapter) -> Knob:
    extra = set(raw) - _RANGE_KEYS
    if extra:
        raise ValueError(f"unknown key(s) {sorted(map(str, extra))} in a range (valid: low, high, step, log)")
    if "low" not in raw or "high" not in raw:
        raise ValueError("a range needs both 'low' and 'high'")
    low, high = adapter.validate_python(raw["low"]), adapter.validate_python(raw["high"])
    if low is None or high is None or low > high:
        raise ValueError(f"range needs low <= high, got low={low}, high={high}")
    log = bool(raw.get("log", False))
    if log and low <= 0:
        raise ValueError("a log range needs low > 0")
    step = raw.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0 or log):
        raise ValueError(f"'step' must be a number > 0 and cannot be combined with log, got step={step!r}")
    return Knob(low=low, high=high, step=step, log=log)


def knob(value_type: Any, *, numeric: bool = False) -> Any:
    """The pydantic type of a knob whose values have ``value_type``."""
    return Annotated[
        Knob,
        BeforeValidator(_parser(value_type, numeric)),
        PlainSerializer(lambda k: k.to_data(), return_type=Any),
        KnobValues(value_type, numeric),
    ]
