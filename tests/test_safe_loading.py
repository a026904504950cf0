"""No loader in the package or scripts can run code hidden in a file.

``torch.load`` without ``weights_only=True`` unpickles arbitrary objects (a checkpoint can run code);
``yaml.load`` with a non-safe loader, ``yaml.unsafe_load``/``full_load``, ``pickle.load`` and
``np.load(..., allow_pickle=True)`` do the same for YAML and arrays. The check reads the syntax tree
(not text), so a call split over lines or a comment mentioning ``torch.load`` does not fool it. A
failure names the file and line of a call that would load an untrusted file unsafely.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "precsearch").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _safe_loader_classes(tree: ast.AST) -> set[str]:
    """Classes in the module that subclass a safe YAML loader (and so only add restrictions)."""
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
            and any(_dotted(b).rsplit(".", 1)[-1] in SAFE_YAML_LOADERS for b in n.bases)}


def unsafe_loads(source: str) -> list[str]:
    """``line: call`` for every call in ``source`` that could execute code from the file it loads."""
    tree = ast.parse(source)
    safe_yaml = SAFE_YAML_LOADERS | _safe_loader_classes(tree)
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = _dotted(call.func)
        if name in ("torch.load", "torch.serialization.load"):
            if not _is_true(_keyword(call, "weights_only")):
                found.append(f"{call.lineno}: {name} without weights_only=True")
        elif name in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all",
                      "pickle.load", "pickle.loads", "dill.load"):
            found.append(f"{call.lineno}: {name}")
        elif name in ("yaml.load", "yaml.load_all"):
            loader = _keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
            if loader is None or _dotted(loader).rsplit(".", 1)[-1] not in safe_yaml:
                found.append(f"{call.lineno}: {name} without a safe Loader")
        elif name in ("np.load", "numpy.load") and _is_true(_keyword(call, "allow_pickle")):
            found.append(f"{call.lineno}: {name} with allow_pickle=True")
    return found


@pytest.mark.parametrize(("source", "flagged"), [
    ("import torch\ntorch.load(p)", True),
    ("import torch\ntorch.load(\n    p,\n    weights_only=False)", True),
    ("import torch\ntorch.load(p, map_location='cpu', weights_only=True)", False),
    ("import yaml\nyaml.load(t)", True),
    ("import yaml\nyaml.load(t, Loader=yaml.Loader)", True),
    ("import yaml\nyaml.load(t, Loader=yaml.SafeLoader)", False),
    ("import yaml\nclass L(yaml.SafeLoader): pass\nyaml.load(t, Loader=L)", False),
    ("import yaml\nyaml.unsafe_load(t)", True),
    ("import pickle\npickle.loads(b)", True),
    ("import numpy as np\nnp.load(p, allow_pickle=True)", True),
    ("import numpy as np\nnp.load(p, allow_pickle=False)", False),
    ("# torch.load(p) in a comment\nx = 'torch.load(p)'", False),
])
def test_the_checker_tells_safe_from_unsafe(source, flagged):
    """Without this the test below could pass because the checker sees nothing."""
    assert bool(unsafe_loads(source)) is flagged


def test_no_unsafe_load_in_package_or_scripts():
    assert len(SOURCES) > 20
    problems = [f"{path.relative_to(ROOT)}:{hit}" for path in SOURCES for hit in unsafe_loads(path.read_text())]
    assert problems == []
