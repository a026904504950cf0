"""``objectives.damage``'s defaults: the placed update_norm limit, and the checkpoint read with ``model.init_from``."""

from __future__ import annotations

import pytest

from precsearch.config.damage_section import DEFAULT_LIMITS, DamageSection
from precsearch.readings.damage import CHECKPOINT_STATES, DEFAULT_STATES
from precsearch.config.space import Space


def space(model: dict | None = None, damage: dict | None = None) -> Space:
    objectives = {"reading": "damage", **({"damage": damage} if damage is not None else {})}
    return Space.model_validate({**({"model": model} if model is not None else {}), "objectives": objectives})


def test_update_norm_defaults_to_the_limit_placed_on_the_soak_judge():
    # benchmarks/place_limit.py on the H100 soak judge: every limit from 0.00172 to 0.00219 separates the cases
    assert DamageSection().limit == DEFAULT_LIMITS["update_norm"] == 0.002
    assert DamageSection(limit=0.01).limit == 0.01  # a written limit is kept


def test_a_random_init_reads_the_middle_and_the_end():
    assert space().objectives.damage.states == list(DEFAULT_STATES) == [0.5, 1.0]


def test_a_checkpoint_is_read_at_its_own_state_too(tmp_path):
    s = space(model={"init_from": str(tmp_path / "model.gguf")})
    assert s.objectives.damage.states == list(CHECKPOINT_STATES) == [0.0, 0.5, 1.0]
    assert s.objectives.damage.state_steps(30) == [0, 15, 30]
    # the space as stored (a study's precsearch.json) loads to the same states
    again = Space.model_validate(s.model_dump(mode="json"))
    assert again.objectives.damage.states == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("states", [[1.0], [0.5, 1.0]])
def test_states_written_in_the_file_are_kept_with_a_checkpoint(tmp_path, states):
    s = space(model={"init_from": str(tmp_path / "model.gguf")}, damage={"states": states})
    assert s.objectives.damage.states == states


def test_a_reading_without_states_leaves_them_alone_with_a_checkpoint(tmp_path):
    s = Space.model_validate({"model": {"init_from": str(tmp_path / "model.gguf")}, "objectives": {"reading": "final"}})
    assert s.objectives.damage.states == list(DEFAULT_STATES)


def test_the_standard_fp8_reference_is_on_by_default_and_takes_only_true_or_false(tmp_path, capsys):
    """``objectives.damage.standard_reference``: one more reading per clip value, on unless switched off; a value
    that is not a YAML boolean (``1``, ``"no"``) is refused naming the field, not read as one."""
    from _spaces import tiny_space_dict, write_space
    from precsearch.cli import main

    assert space().objectives.damage.standard_reference is True
    assert space(damage={"standard_reference": False}).objectives.damage.standard_reference is False
    for bad in (1, "no"):
        path = write_space(tmp_path, tiny_space_dict(**{"objectives.reading": "damage",
                                                        "objectives.damage.standard_reference": bad}))
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err
        assert "objectives.damage.standard_reference" in err and "boolean" in err and "Traceback" not in err, err
