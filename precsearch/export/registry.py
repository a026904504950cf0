"""The export formats (``--format``): one registry, read by :func:`render`, validation and the CLI.

Formats: ``policy`` (precsearch's own ``policy.yaml``), ``megatron``
(Megatron-LM arguments and a ``--te-precision-config-file``), ``torchtitan``
(a float8 converter TOML section) and ``accelerate`` (a Python snippet). Each
renders ``(policy, n_layers, provenance, pipeline) -> Rendered``
(:mod:`precsearch.export.format_output`) and says what the framework runs of its files
(:func:`as_run`, :mod:`precsearch.export.as_run`); only Megatron takes a pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from precsearch.errors import UserError
from precsearch.export.accelerate import accelerate_as_run, accelerate_files
from precsearch.export.as_run import AsRun, as_searched
from precsearch.export.megatron import megatron_as_run, megatron_files
from precsearch.export.format_output import Rendered
from precsearch.export.torchtitan import torchtitan_as_run, torchtitan_files
from precsearch.policy.file import dump_policy
from precsearch.policy.rules import Policy


@dataclass(frozen=True)
class ExportFormat:
    """One export format.

    Attributes:
        render: ``(policy, n_layers, provenance, pipeline) -> Rendered``.
        as_run: ``(policy, n_layers, pipeline) -> AsRun``: what the framework runs of the rendered files.
        pipeline: Whether the format can split a policy over pipeline stages (``--pipeline-parallel``).
        framework: Whether the files are a training framework's (whose export says what changes), not
            precsearch's own ``policy.yaml``.
    """

    render: Callable[[Policy, int, dict[str, Any], int], Rendered]
    as_run: Callable[[Policy, int, int], AsRun]
    pipeline: bool = False
    framework: bool = True


def _policy_files(policy: Policy, n_layers: int, provenance: dict[str, Any], pipeline: int) -> Rendered:
    return Rendered({"policy.yaml": dump_policy(policy, provenance)})


FORMATS: dict[str, ExportFormat] = {
    "policy": ExportFormat(_policy_files, lambda policy, n, pipeline: as_searched(policy, n), framework=False),
    "megatron": ExportFormat(megatron_files, megatron_as_run, pipeline=True),
    "torchtitan": ExportFormat(lambda policy, n, prov, pipeline: torchtitan_files(policy, n, prov),
                               lambda policy, n, pipeline: torchtitan_as_run(policy, n)),
    "accelerate": ExportFormat(lambda policy, n, prov, pipeline: accelerate_files(policy, n, prov),
                               lambda policy, n, pipeline: accelerate_as_run(policy, n)),
}
"""Format name -> format, in the order ``--format`` lists them (the first is the default)."""


def render(fmt: str, policy: Policy, n_layers: int, provenance: dict[str, Any] | None = None, *,
           pipeline: int = 1) -> Rendered:
    """Render ``policy`` for a model with ``n_layers`` blocks in format ``fmt``.

    ``pipeline`` (Megatron only): model chunks of the run, pipeline stages x virtual stages.
    """
    _check(fmt, n_layers, pipeline)
    return FORMATS[fmt].render(policy, n_layers, provenance or {}, pipeline)


def as_run(fmt: str, policy: Policy, n_layers: int, *, pipeline: int = 1) -> AsRun:
    """What the framework of format ``fmt`` runs of ``policy``'s files (:class:`~precsearch.export.as_run.AsRun`)."""
    _check(fmt, n_layers, pipeline)
    return FORMATS[fmt].as_run(policy, n_layers, pipeline)


def _check(fmt: str, n_layers: int, pipeline: int) -> None:
    if n_layers < 1:
        raise UserError(f"n_layers must be at least 1, got {n_layers}", field="--n-layers")
    if pipeline != 1 and not (fmt in FORMATS and FORMATS[fmt].pipeline):
        raise UserError(f"applies to --format megatron only (got --format {fmt})", field="--pipeline-parallel")
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}", field="--format")


__all__ = ["FORMATS", "ExportFormat", "as_run", "render"]
