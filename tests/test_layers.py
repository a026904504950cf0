"""The import graph of ``precsearch`` against its layer list (:mod:`precsearch._layers`).

Every ``import`` in every module counts, function-level ones included: a lazy import still
makes the importer depend on what it imports. If a test here fails, a module reaches up the
layers (or two modules need each other) and the code is in the wrong place.
"""

from __future__ import annotations

import ast
from pathlib import Path

from precsearch._layers import BEYOND_COLUMN, LAYERS, MAY_IMPORT, UPWARD_ALLOWED, layer_of, may_import

PACKAGE = Path(__file__).resolve().parents[1] / "precsearch"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports: ``from a import b`` counts as ``a.b`` where that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
            found.update(subs or [base])
    return {target for target in found if target in modules and target != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _file(name: str) -> str:
    return str(_modules()[name].relative_to(PACKAGE.parent))


def test_every_module_has_a_layer():
    for name in _modules():
        layer_of(name)  # raises, naming the module


def test_no_import_points_up_the_layers():
    upward = []
    for importer, targets in _graph().items():
        for target in sorted(targets):
            if layer_of(target) > layer_of(importer) and (importer, target) not in UPWARD_ALLOWED:
                upward.append(f"{_file(importer)} ({LAYERS[layer_of(importer)][0]}) imports "
                              f"{_file(target)} ({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_every_layer_has_a_may_import_column():
    assert set(MAY_IMPORT) == {name for name, _ in LAYERS}


def test_every_import_is_in_its_layers_may_import_column():
    """LAYERS.md's "may import" column, not only the order: config knows no backend, export no study."""
    outside = []
    for importer, targets in _graph().items():
        for target in sorted(targets):
            a, b = LAYERS[layer_of(importer)][0], LAYERS[layer_of(target)][0]
            if layer_of(target) > layer_of(importer) or (importer, target) in UPWARD_ALLOWED | BEYOND_COLUMN:
                continue  # upward: test_no_import_points_up_the_layers
            if not may_import(a, b):
                outside.append(f"{_file(importer)} ({a}) imports {_file(target)} ({b})")
    assert not outside, "imports outside the may-import column:\n" + "\n".join(outside)


def test_no_import_cycle():
    graph = _graph()
    for importer, target in UPWARD_ALLOWED:  # lazy on purpose, see precsearch._layers
        graph[importer].discard(target)
    # a package's __init__ re-exporting its modules is not a cycle with them
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".") and not t.startswith(name + ".")}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                loop = stack[stack.index(target):] + [target]
                cycles.append(" -> ".join(_file(m) for m in loop))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_upward_and_cyclic_imports(tmp_path):
    """The walk finds a function-level import and a relative one (else the tests above could not fail)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from precsearch.cli import main\n    from . import errors\n")
    modules = {"precsearch.cli": module, "precsearch.errors": module, "precsearch.m": module}
    assert _imports("precsearch.m", module, modules) == {"precsearch.cli", "precsearch.errors"}
    assert layer_of("precsearch.cli") > layer_of("precsearch.errors")
    # the column refuses what the order alone allows (export is above search, but may not import it)
    assert layer_of("precsearch.export") > layer_of("precsearch.search")
    assert not may_import("export", "search") and not may_import("config", "backends")
    assert may_import("cli", "runtime") and may_import("export", "policy") and not may_import("base", "cli")
