"""The package's layers, bottom first: each may import the layers below it, never those above.

This list is the one place the layering is written down. ``tests/test_layers.py`` walks every
module's imports (function-level ones included) and fails on an import that points up this list
or on an import cycle between modules, naming both files; the README's "How the code is laid
out" section describes the same list. It lives in the package, not in the test, so that a
reader of the package finds it beside the code it describes, and so that new modules can be
checked against it; nothing in the package imports it.

A module belongs to the first layer with a prefix that is the module's dotted name or a
package above it.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("precsearch._layers", "precsearch.errors", "precsearch.precision", "precsearch.precision_spec",
              "precsearch.redact",
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
    ("runtime", ("precsearch.runtime",)),
    ("export", ("precsearch.export",)),
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
