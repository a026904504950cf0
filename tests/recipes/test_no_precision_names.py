"""Nothing outside ``precsearch/recipes/`` names a precision: every consumer asks the recipe.

A layers-style check (as ``tests/test_layers.py`` walks imports, and ``tests/readings/test_no_reading_names.py``
the readings): it walks every module of the package outside ``precsearch/recipes/`` and the enum's own module
(``precsearch/precision.py``) and fails on

* an attribute ``Precision.<MEMBER>`` (``p is Precision.FP8_DELAYED``, ``{Precision.MXFP8: ...}``), and
* a string constant that is a low precision's value (``p.value == "mxfp8"``): ``"bf16"`` is left out, as it is
  also the dtype every module names (``param_dtype: bf16``),

naming file and line. Prose is not a use: a docstring or message that mentions a precision is a longer string.
If this fails, a module switches on a precision; give the recipe an attribute or method that answers the
question (:mod:`precsearch.recipes.base` states the contract), and ask it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from precsearch.precision import Precision

PACKAGE = Path(__file__).resolve().parents[2] / "precsearch"
NAMES = {p.value for p in Precision if p.is_fp8}

#: (file under the package, name) -> why it may spell a precision's value: another concept's value that
#: happens to be spelled alike.
ALLOWED: dict[tuple[str, str], str] = {
    ("storage.py", "fp8_block"): "the block-scaled moment storage's value in policy and space files (moment_dtype: "
                                 "fp8_block), spelled like the GEMM recipe since before the two had names of their own; "
                                 "code names it storage.BLOCK_FP8",
}


def _offenders(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if package / "recipes" in path.parents or rel == "precision.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Precision" \
                    and node.attr.isupper():
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: Precision.{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in NAMES and (rel, node.value) not in ALLOWED:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_outside_recipes_names_a_precision():
    offenders = _offenders()
    assert not offenders, "a precision named outside precsearch/recipes/ (ask the recipe instead):\n" + \
        "\n".join(offenders)


def test_the_allowed_names_are_still_there():
    """An allowance whose site is gone is dead weight that would hide a new use: remove it."""
    for rel, name in ALLOWED:
        tree = ast.parse((PACKAGE / rel).read_text())
        assert any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree)), (rel, name)


def test_the_check_sees_a_named_precision(tmp_path):
    """The walk finds a branch on a member and a comparison with a value outside ``recipes/`` and none inside
    it, and lets prose mentioning one pass (else the test above passes on anything, or fails on docstrings)."""
    name = sorted(NAMES)[0]
    member = Precision(name).name
    (tmp_path / "pkg" / "recipes").mkdir(parents=True)
    (tmp_path / "pkg" / "m.py").write_text(
        f'"""Runs {name} here."""\ndef f(p):\n    return p is Precision.{member} or p.value == {name!r}\n')
    (tmp_path / "pkg" / "recipes" / "r.py").write_text(f"NAME = {name!r}\nP = Precision.{member}\n")
    assert _offenders(tmp_path / "pkg") == [f"pkg/m.py:3: Precision.{member}", f"pkg/m.py:3: {name!r}"]
