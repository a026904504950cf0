"""The contract of :class:`precsearch.readings.StabilityReading`, run over every registered reading.

A new reading in the registry runs here with no change to this file; if a test fails for it, a consumer
that asks the reading (scoring, the front, the reports, the export, the probe host) would get a wrong
answer from it.
"""

from __future__ import annotations

import math

import pytest

from precsearch.config.space import ObjectivesSection
from precsearch.instability import StudyUnit
from precsearch.probe.result import ProbeResult
from precsearch.readings import DIVERGED_INSTABILITY, READINGS, StabilityReading, get_reading
from precsearch.search.scoring import score, stability_metrics, verdict

LOSSES = [4.0, 3.0, 2.5, 2.0, 2.0, 2.0, 2.0, 2.0]


def _result(eval_loss: float = 2.0, losses: list[float] | None = None, damage: dict | None = None) -> ProbeResult:
    return ProbeResult(losses=list(losses or LOSSES), eval_loss=eval_loss, peak_memory_bytes=1000,
                       target_memory_bytes=1000, tokens_per_s=100.0, damage=damage)


def _objectives(name: str, **kw) -> ObjectivesSection:
    return ObjectivesSection(reading=name, spike_penalty=0.0, **kw)


@pytest.fixture(params=list(READINGS), ids=list(READINGS))
def reading(request) -> StabilityReading:
    return READINGS[request.param]


def test_its_name_picks_it_in_the_space_file(reading):
    """The registry's key, the object's name and the space file's value are one name; else a study picks a
    reading the scorer does not find."""
    assert get_reading(reading.name) is reading and reading.description
    assert _objectives(reading.name).reading == reading.name


def test_a_copy_of_bf16_is_stable(reading):
    """BF16 against itself (every gap 0, a fixed-state reading of 0) is stable: a reading that failed it would
    leave no feasible trial."""
    ref = _result(damage={"value": 0.0, "se": 0.0})
    s = score(ref, ref, _objectives(reading.name))
    assert s.stable and s.feasible and s.instability == 0.0 and s.reading == reading.name


def test_what_it_cannot_read_is_unstable_never_stable(reading):
    """A probe whose read figure is missing (no tail, no held-out loss gap, no fixed-state reading) fails the
    limit: a reading that passed it would put an unread trial on the front."""
    judged = reading.judge(_result(), _objectives(reading.name), gap=math.nan, tail=math.nan, excess=0,
                           floor=math.nan)
    assert judged.constraint >= DIVERGED_INSTABILITY


def test_events_beyond_bf16_never_make_a_trial_more_stable(reading):
    """Loss spikes and blow-ups BF16 did not have can only raise the constraint."""
    objectives = _objectives(reading.name).model_copy(update={"spike_penalty": 0.002})
    clean = _result(damage={"value": 0.001, "se": 0.0})
    calm = reading.judge(clean, objectives, gap=0.001, tail=0.001, excess=0, floor=0.01)
    spiky = reading.judge(clean, objectives, gap=0.001, tail=0.001, excess=3, floor=0.01)
    assert spiky.constraint >= calm.constraint and spiky.instability >= calm.instability


def test_its_noise_floor_is_a_relative_seed_spread(reading):
    """Three seeds give a finite, positive relative spread; one seed gives none (NaN, never 0)."""
    seeds = [_result(2.0 + d, [x + d for x in LOSSES]) for d in (-0.02, 0.0, 0.02)]
    assert 0 < reading.noise_floor(seeds, 0.25) < 0.1
    assert math.isnan(reading.noise_floor(seeds[:1], 0.25))


def test_its_unit_and_limit_are_the_studys(reading):
    """The unit and limit the study prints (:class:`StudyUnit`) are those the reading states, and the space's
    ``instability_limit`` is the same number; a reading with its own unit names it."""
    objectives = _objectives(reading.name)
    unit = StudyUnit.of(objectives.model_dump())
    assert unit.kind == reading.unit_kind(objectives.stability_unit) == objectives.instability_unit
    assert unit.limit == reading.limit(objectives.model_dump()) == objectives.instability_limit
    if reading.own_unit:
        assert unit.kind == reading.name and unit.measure and reading.unit_name(unit.measure) == unit.name
        assert reading.legacy_column and reading.plot_subject
    else:
        assert unit.kind == objectives.stability_unit and not unit.measure
        assert math.isnan(reading.standard_error({"instability_se": 0.1}))


def test_its_report_words_and_metrics(reading):
    """Its verdict figures follow the verdict word, its metrics are numbers, and its infeasible reason quotes
    the reading it is given."""
    ref = _result(damage={"value": 0.0, "se": 0.0})
    worse = _result(2.1, [1.05 * x for x in LOSSES], damage={"value": 0.5, "se": 0.01})
    s = score(worse, ref, _objectives(reading.name))
    assert verdict(s).startswith("unstable; ") and reading.verdict_figures(s).startswith("; ")
    assert all(isinstance(v, float) for v in reading.metrics(s).values())
    assert set(reading.metrics(s)) <= set(stability_metrics(s))
    assert "0.5 of 0.01" in reading.infeasible_reason("0.5 of 0.01")
    # the measure a stored score names is the one the study reads (the front and MLflow name the unit by it)
    assert reading.row_measure(s.to_dict()) == reading.measure(_objectives(reading.name).model_dump()) \
        if reading.own_unit else reading.row_measure(s.to_dict()) == ""


def test_fixed_states_readings_read_one_process_probes(reading):
    """A reading at fixed states of a BF16 run needs the whole model in one process: validation refuses a
    sharded probe for it (naming the field), and only for it."""
    from _spaces import tiny_space_dict

    from precsearch.config.checks import check_space
    from precsearch.config.loader import parse_space
    from precsearch.errors import UserError

    space = parse_space(tiny_space_dict(**{"objectives.reading": reading.name, "probe.nproc": 2,
                                           "probe.micro_batch": 4}))
    if reading.fixed_states:
        with pytest.raises(UserError, match=r"objectives.reading.*nproc"):
            check_space(space, file="space.yaml")
    else:
        try:
            check_space(space, file="space.yaml")
        except UserError as err:  # another check may refuse a two-process CPU space; never for the reading
            assert "one-process" not in str(err)


def test_its_side_runs_say_what_is_left_and_what_a_side_cost(reading):
    """The loop asks every reading's side runs alike: a fixed-state reading has one side per clipping value
    (its steps ahead for the time left, a notice at the first trial of each value only, the side's seconds
    taken out of the trial's); any other has none. Else the ETA counts sides that never run, or a 20 s side as
    trial time (5x the time left on the 8B space, 2026-12-05)."""
    sides = reading.side_runs([0.0, 1.0], steps=40)
    result = _result(damage={"value": 0.0, "se": 0.0, "bf16_side_s": 20.0})
    if reading.fixed_states:
        assert sides.steps_ahead() == 80
        assert "clip_grad=1.0" in sides.begin(1.0, trial=0)
        assert sides.begin(1.0, trial=1) is None and sides.steps_ahead() == 40
        assert sides.seconds_in(result) == 20.0 and sides.seconds_in(_result()) == 0.0
    else:
        assert sides.steps_ahead() == 0 and sides.begin(1.0, trial=0) is None and sides.seconds_in(result) == 0.0


def test_only_a_fixed_states_reading_reads_the_standard_fp8_recipe_and_as_its_space_says(reading):
    """The standard FP8 recipe is read at the BF16 side's states: a reading without them reads none (its trials show
    no multiple), one with them reads it unless ``objectives.damage.standard_reference`` is false."""
    on, off = _objectives(reading.name), _objectives(reading.name, damage={"standard_reference": False})
    assert reading.standard_reference(on) == reading.fixed_states
    assert reading.standard_reference(off) is False
