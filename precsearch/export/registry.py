"""The export formats (``--format``): one registry, read by :func:`render`, validation and the CLI.

Formats: ``policy`` (precsearch's own ``policy.yaml``), ``megatron``
(Megatron-LM arguments and a ``--te-precision-config-file``), ``torchtitan``
(a float8 converter TOML section) and ``accelerate`` (a Python snippet). Each
renders ``(policy, n_layers, provenance, pipeline) -> Rendered``
(:mod:`precsearch.export.format_output`) and says what the framework runs of its files
(:func:`as_run`, :mod:`precsearch.export.as_run`); only Megatron takes a pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from precsearch.errors import UserError
from precsearch.export.accelerate import accelerate_as_run, accelerate_files
from precsearch.export.as_run import AsRun, as_searched, describe_changes
from precsearch.export.megatron import megatron_as_run, megatron_files
from precsearch.export.format_output import Rendered
from precsearch.export.torchtitan import torchtitan_as_run, torchtitan_files
from precsearch.policy.file import dump_policy
from precsearch.policy.rules import Policy
from precsearch.version import __version__


@dataclass(frozen=True)
class ExportFormat:
    """One export format.

    Attributes:
        render: ``(policy, n_layers, provenance, pipeline) -> Rendered``.
        as_run: ``(policy, n_layers, pipeline) -> AsRun``: what the framework runs of the rendered files.
        pipeline: Whether the format can split a policy over pipeline stages (``--pipeline-parallel``).
        target: The name of what runs the files, as a space's ``target: name`` gives it (``precsearch``
            for ``policy.yaml``, run by precsearch's Python API and optimizer).
        checked: The target's version the format was checked against (a space's default ``target: version``).
        oldest: The oldest version the files run on (numbers of the version, ``(0, 16)``); () for any.
        before: The first version they no longer run on, or None.
        framework: Whether the files are a training framework's (whose export says what changes), not
            precsearch's own ``policy.yaml``.

    What a target cannot express is what its :attr:`as_run` says it runs otherwise (:func:`cannot_express`):
    the same reading of the written files that the export's "what changes" report and its warnings come
    from, so validation, the front and the export cannot disagree.
    """

    render: Callable[[Policy, int, dict[str, Any], int], Rendered]
    as_run: Callable[[Policy, int, int], AsRun]
    target: str
    checked: str
    oldest: tuple[int, ...] = ()
    before: tuple[int, ...] | None = None
    pipeline: bool = False
    framework: bool = True


def _policy_files(policy: Policy, n_layers: int, provenance: dict[str, Any], pipeline: int) -> Rendered:
    return Rendered({"policy.yaml": dump_policy(policy, provenance)})


FORMATS: dict[str, ExportFormat] = {
    "policy": ExportFormat(_policy_files, lambda policy, n, pipeline: as_searched(policy, n), "precsearch",
                           __version__, framework=False),
    # --te-precision-config-file (per-module recipes) needs core_v0.16.0 (megatron.py)
    "megatron": ExportFormat(megatron_files, megatron_as_run, "megatron", "core_v0.16.0", (0, 16), pipeline=True),
    # the TOML sections of v0.2.x; v0.3 and later are configured in Python (torchtitan.py)
    "torchtitan": ExportFormat(lambda policy, n, prov, pipeline: torchtitan_files(policy, n, prov),
                               lambda policy, n, pipeline: torchtitan_as_run(policy, n), "torchtitan", "0.2.2",
                               (0, 2), (0, 3)),
    # the snippet ran with accelerate 1.15 and 1.16 (accelerate.py)
    "accelerate": ExportFormat(lambda policy, n, prov, pipeline: accelerate_files(policy, n, prov),
                               lambda policy, n, pipeline: accelerate_as_run(policy, n), "accelerate", "1.16",
                               (1, 15)),
}
"""Format name -> format, in the order ``--format`` lists them (the first is the default)."""

TARGETS: dict[str, str] = {f.target: name for name, f in FORMATS.items()}
"""Target name (a space's ``target: name``) -> its format, in the order of :data:`FORMATS`."""


def cannot_express(fmt: str, policy: Policy, n_layers: int, param_dtype: str = "fp32") -> list[str]:
    """What format ``fmt``'s framework runs otherwise than ``policy``, one line per change (modules whose
    precision changes, memory knobs, FP8 warm-up, FP8 format); empty when it runs the policy as it is.

    ``param_dtype``: the probe's parameter dtype, which ``param`` moments follow.
    """
    return describe_changes(as_searched(policy, n_layers), as_run(fmt, policy, n_layers), param_dtype)


def version_problem(fmt: str, version: str) -> str | None:
    """Why format ``fmt``'s files do not run on ``version`` of its target, or None when they do (or when the
    version has no number to compare)."""
    f = FORMATS[fmt]
    numbers = tuple(int(n) for n in re.findall(r"\d+", version))
    if not numbers or f.framework is False:
        return None
    if numbers < f.oldest or (f.before is not None and numbers >= f.before):
        span = f"{_dotted(f.oldest)} or newer" + (f", before {_dotted(f.before)}" if f.before else "")
        return f"precsearch's {fmt} export runs on {f.target} {span} (checked against {f.checked}); got {version}"
    return None


def _dotted(numbers: tuple[int, ...]) -> str:
    return ".".join(map(str, numbers))


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


__all__ = ["FORMATS", "TARGETS", "ExportFormat", "as_run", "cannot_express", "render", "version_problem"]
