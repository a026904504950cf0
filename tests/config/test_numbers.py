"""Bad input, class "numbers out of range" (issue 34): one rule for every numeric field, space and policy.

The table is not written by hand: it is every numeric field the pydantic models of a space file and
of ``policy.yaml`` have, found by walking them, so a field added tomorrow is in it. For each field
the test tries the value just below its lower bound, just above its upper bound, ``true`` (which
Python would read as 1) and ``"inf"``, and each must be refused with exit 2 (or ``UserError``) naming
the field. A failure means a user gets a traceback later (a negative seed crashed Optuna's sampler
after the study had started), a silent 1 for ``true``, or a message that blames another field.

The walk also fails on a numeric field without a declared lower bound (or, for an integer, upper
bound): the rule is that each declares its range (``precsearch.utils.numbers``).
"""

from __future__ import annotations

import copy
import typing

import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main

#: list- and tuple-valued numeric fields, whose range a validator (not field metadata) checks.
CHECKED_BY_VALIDATOR = {
    ("probe", "betas"): [[-0.1, 0.9], [0.9, 1.0], [True, 0.9], ["inf", 0.9]],
    ("study", "fidelity", "rungs"): [[12, 0], [12, 10**13], [12, True]],
    ("search", "units", 0, "blocks"): [[-1], [True]],
    ("search", "groups", 0, "layers", "indices"): [[-1], [True], [10**13]],
    ("objectives", "damage", "states"): [[-0.1], [1.5], [True], ["inf"]],
}
#: Optional sections a field lives in, and the least they need to be valid around it.
CONTEXT = {("study", "fidelity"): {"rungs": [12]}}


def _bounds(field) -> dict[str, float]:
    names = ("Gt", "Ge", "Lt", "Le")
    return {type(m).__name__: getattr(m, type(m).__name__.lower()) for m in field.metadata if type(m).__name__ in names}


def _is_number(annotation) -> bool:
    return annotation in (int, float) or any(_is_number(a) for a in typing.get_args(annotation))


def _models_in(annotation):
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, False
    for arg in typing.get_args(annotation):
        for model, _ in _models_in(arg):
            yield model, typing.get_origin(annotation) is list


def walk(model, loc=()):
    """(loc, field) for every field under ``model``; a list of sections is entered at index 0."""
    for name, field in model.model_fields.items():
        here = (*loc, name)
        yield here, field
        for sub, in_list in _models_in(field.annotation):
            yield from walk(sub, (*here, 0) if in_list else here)


def _space_numbers():
    from precsearch.config import knob as knobs
    from precsearch.config.space import Space

    marker = getattr(knobs, "KnobValues", ())  # () where knobs carry no marker (main before issue 34)
    for loc, field in walk(Space):
        knob = next((m for m in field.metadata if isinstance(m, marker)), None)
        if knob is not None and knob.numeric:
            yield loc, "knob", field
        elif knob is None and _is_number(field.annotation):
            yield loc, "number", field


SPACE_NUMBERS = list(_space_numbers())


def _bad_values(loc, kind, field) -> list:
    if loc in CHECKED_BY_VALIDATOR:
        return CHECKED_BY_VALIDATOR[loc]
    if kind == "knob":  # every numeric knob is a count, a margin or a threshold: none may be negative
        return [-1, True, {"choices": [1, True]}, {"low": True, "high": 4}]
    b, is_int = _bounds(field), int in (field.annotation, *typing.get_args(field.annotation))
    # a field without a declared bound (the walk test above fails on it) is still tried with -1 / 2**62
    below = b["Gt"] if "Gt" in b else b["Ge"] - 1 if "Ge" in b else -1
    above = [b["Le"] + 1] if "Le" in b else [b["Lt"]] if "Lt" in b else [2**62] if is_int else []
    return [below, *above, True, *([] if is_int else ["inf"])]


def _place(data: dict, loc: tuple, value) -> dict:
    data = copy.deepcopy(data)
    node = data
    for i, part in enumerate(loc[:-1]):
        nxt = loc[i + 1]
        if isinstance(part, int):
            while len(node) <= part:
                node.append({})
        elif part not in node or node[part] is None:
            node[part] = [] if isinstance(nxt, int) else copy.deepcopy(CONTEXT.get(loc[:i + 1], {}))
        node = node[part]
    node[loc[-1]] = value
    return data


def _dotted(loc: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def test_every_numeric_field_declares_its_range():
    """A number without a range is the next negative seed: each declares a lower bound, each integer an upper."""
    assert len(SPACE_NUMBERS) >= 40, "the walk found too few fields: it would make the table below vacuous"
    missing = []
    for loc, kind, field in SPACE_NUMBERS:
        if kind == "knob" or loc in CHECKED_BY_VALIDATOR:
            continue
        b = _bounds(field)
        is_int = int in (field.annotation, *typing.get_args(field.annotation))
        if not b.keys() & {"Gt", "Ge"} or (is_int and not b.keys() & {"Lt", "Le"}):
            missing.append(_dotted(loc))
    assert not missing, f"numeric fields without a declared range: {missing}"


CASES = [(loc, value) for loc, kind, field in SPACE_NUMBERS for value in _bad_values(loc, kind, field)]


@pytest.mark.parametrize("loc, value", CASES, ids=[f"{_dotted(loc)}={value!r}" for loc, value in CASES])
def test_out_of_range_or_wrong_type_is_refused_naming_the_field(tmp_path, capsys, loc, value):
    path = write_space(tmp_path, _place(tiny_space_dict(), loc, value))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2, f"accepted: {err!r}"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{path}: {_dotted(loc)}" in err, f"does not name {_dotted(loc)}: {err!r}"


@pytest.mark.parametrize("field", ["probe.seed", "study.seed"])
@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_seeds_at_the_ends_of_their_range_are_accepted(tmp_path, capsys, field, seed):
    assert main(["validate", str(write_space(tmp_path, tiny_space_dict(**{field: seed})))]) == 0, \
        capsys.readouterr().err


def test_the_largest_study_seed_still_seeds_a_worker_and_a_resume():
    """Workers add an offset (up to 100 000) and a resume the trial count: the sum must stay a valid seed."""
    from precsearch.config.loader import parse_space
    from precsearch.runtime.stores import make_sampler

    for sampler in ("tpe", "nsga2", "random"):
        study = parse_space(tiny_space_dict(**{"study.seed": 2**32 - 1, "study.sampler": sampler})).study
        make_sampler(study, 100_000 + 5_000)


# --- policy.yaml ---------------------------------------------------------------------------------

POLICY = {"schema_version": 1, "policy": {"default": "bf16", "rules": [
    {"name": "r", "modules": ["*"], "precision": "bf16", "layers": {"first": 1}}]}}


def _policy_numbers():
    from precsearch.policy.schema import PolicyFile

    for loc, field in walk(PolicyFile):
        if _is_number(field.annotation):
            yield loc
    yield ("policy", "clip_grad")  # typed Any: its own check takes null or a number
    yield ("policy", "rules", 0, "layers", "indices")


def _policy_bad_values(loc: tuple) -> list:
    if loc[-1] == "indices":
        return [[-1], [True], [10**13]]
    if loc[-1] == "clip_grad":  # any finite threshold > 0 is valid, however large
        return [-1, True, "inf"]
    return [-1, 10**13, True, "inf"]


POLICY_CASES = [(loc, value) for loc in _policy_numbers() for value in _policy_bad_values(loc)]


@pytest.mark.parametrize("loc, value", POLICY_CASES, ids=[f"{_dotted(loc)}={value!r}" for loc, value in POLICY_CASES])
def test_policy_number_out_of_range_or_wrong_type_is_refused(tmp_path, loc, value):
    import yaml

    import precsearch
    from precsearch.errors import UserError

    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(_place(POLICY, loc, value)))
    with pytest.raises(UserError) as info:
        precsearch.load_policy(path)
    assert _dotted(loc) in str(info.value), str(info.value)
