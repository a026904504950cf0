"""The package's layers, bottom first: each may import the layers below it that it lists, never those above.

This list is the one place the layering is written down (``shared/LAYERS.md`` describes it: its
"may import" column is :data:`MAY_IMPORT`). ``tests/test_layers.py`` walks every module's imports
(function-level ones included) and fails on an import that points up this list, on one to a layer
its "may import" column does not name, or on an import cycle between modules, naming both files; the README's "How the code is laid
out" section describes the same list. It lives in the package, not in the test, so that a
reader of the package finds it beside the code it describes, and so that new modules can be
checked against it; nothing in the package imports it.

A module belongs to the first layer with a prefix that is the module's dotted name or a
package above it.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("precsearch._layers", "precsearch.errors", "precsearch.instability", "precsearch.precision",
              "precsearch.precision_spec",
              "precsearch.readings",
              "precsearch.recipes",
              "precsearch.redact",
              "precsearch.soak",
              "precsearch.storage",
              "precsearch.version",
              "precsearch.utils")),
    ("numerics", ("precsearch.fp8", "precsearch.cpu_bf16")),
    ("model config", ("precsearch.arch",)),
    ("policy", ("precsearch.policy",)),
    ("backends", ("precsearch.backends",)),
    ("config", ("precsearch.config",)),
    ("probe", ("precsearch.probe",)),
    ("tracking", ("precsearch.tracking",)),
    ("search", ("precsearch.search",)),
    # export reads no study (runtime.study_export does, and renders with export), so it sits below runtime
    ("export", ("precsearch.export",)),
    ("runtime", ("precsearch.runtime",)),
    ("cli", ("precsearch.cli", "precsearch.cli_checks", "precsearch.__main__", "precsearch")),
)
"""(layer name, module prefixes), bottom first. ``precsearch`` itself (the package's
``__init__``, whose :func:`precsearch.load_policy` is the public entry point) is the top."""

UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("precsearch.policy", "precsearch.backends.policy_runtime"):
        "the policy's public API (precsearch.policy.load_policy, PolicyRuntime) hands applying a policy to "
        "the backends, imported lazily on first use; scripts written by 'precsearch export' import it from here",
}
"""The upward imports kept on purpose, (importer, imported) -> why."""

BELOW = "every layer below"
#: Layer -> the layers below it that it may import (LAYERS.md's "may import" column), or :data:`BELOW`.
MAY_IMPORT: dict[str, tuple[str, ...] | str] = {
    "base": (),
    "numerics": ("base",),
    "model config": ("base",),
    "policy": ("base", "model config"),
    # model config beyond LAYERS.md's column: a backend converts a model's units by name (arch.units)
    "backends": ("base", "numerics", "model config", "policy"),
    "config": ("base", "model config", "policy"),
    "probe": BELOW,
    # numerics and model config beyond the column: reports label tensors by role and units by name;
    # tracking records, so it imports no backend and nothing that runs a search
    "tracking": ("base", "numerics", "model config", "config", "policy", "probe"),
    "search": BELOW,
    "runtime": BELOW,
    "export": ("base", "model config", "policy"),
    "cli": BELOW,
}

BEYOND_COLUMN: dict[tuple[str, str], str] = {
    ("precsearch.config.space", "precsearch.backends.registry"):
        "the space file's 'backend' takes its choices from the backend registry (one registry per pluggable "
        "kind, read by validation and the CLI); registry.py imports no backend until one is built",
}
"""Imports kept on purpose outside the importer's "may import" column, (importer, imported) -> why."""


def may_import(importer: str, imported: str) -> bool:
    """Whether layer ``importer`` may import layer ``imported`` (layer names of :data:`LAYERS`)."""
    names = [name for name, _ in LAYERS]
    if names.index(imported) >= names.index(importer):
        return imported == importer
    allowed = MAY_IMPORT[importer]
    return allowed == BELOW or imported in allowed


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (a dotted name); ValueError if no layer claims it."""
    best = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), index))
    if best[1] < 0:
        raise ValueError(f"module {module} is in no layer of precsearch._layers.LAYERS")
    return best[1]
