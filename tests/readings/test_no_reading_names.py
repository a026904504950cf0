"""Nothing outside ``precsearch/readings/`` names a reading: every consumer asks the reading object.

A layers-style check (as ``tests/test_layers.py`` walks imports): it walks every module of the package
outside ``precsearch/readings/`` and fails on a string constant that is a registered reading's name
(``reading == "damage"``, ``{"damage": ...}``, a ``Literal`` that lists the readings), naming file and line.
Prose is not a use: a docstring or a message that mentions a reading is a longer string. If this fails, a
module switches on a reading's name; give the reading a method or attribute that answers the question, and
ask it (:mod:`precsearch.readings.base` states the contract).
"""

from __future__ import annotations

import ast
from pathlib import Path

from precsearch.readings import READING_NAMES

PACKAGE = Path(__file__).resolve().parents[2] / "precsearch"


def _offenders(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        if package / "readings" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in READING_NAMES:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_outside_readings_names_a_reading():
    offenders = _offenders()
    assert not offenders, "a reading named outside precsearch/readings/ (ask the reading instead):\n" + \
        "\n".join(offenders)


def test_the_check_sees_a_named_reading(tmp_path):
    """The walk finds a comparison with a reading's name outside ``readings/`` and none inside it, and lets
    prose mentioning one pass (else the test above passes on anything, or fails on docstrings)."""
    name = READING_NAMES[-1]
    (tmp_path / "pkg" / "readings").mkdir(parents=True)
    (tmp_path / "pkg" / "m.py").write_text(f'"""Reads {name} here."""\ndef f(o):\n    return o.reading == {name!r}\n')
    (tmp_path / "pkg" / "readings" / "r.py").write_text(f"NAME = {name!r}\n")
    assert _offenders(tmp_path / "pkg") == [f"pkg/m.py:3: {name!r}"]
