"""One registry per pluggable kind: the CLI and validation offer exactly what the registries hold.

If a test here fails, a list of choices was typed again somewhere instead of read from its registry.
"""

from __future__ import annotations

import argparse

from precsearch.backends.registry import BACKEND_CHOICES, BACKENDS
from precsearch.cli import build_parser
from precsearch.config.space import BackendName
from precsearch.export.pick import PICKS
from precsearch.export.registry import FORMATS


def _export_choices(dest: str) -> tuple[str, ...]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices["export"]._actions if a.dest == dest)
    return tuple(action.choices)


def test_cli_export_choices_are_the_registries():
    assert _export_choices("format") == tuple(FORMATS) == ("policy", "megatron", "torchtitan", "accelerate")
    assert _export_choices("pick") == tuple(PICKS) == ("max-memory", "fastest", "most-stable")


def test_the_space_files_backends_are_the_registry():
    assert tuple(b.value for b in BackendName) == BACKEND_CHOICES == ("auto", *BACKENDS)


def test_the_space_files_targets_are_the_export_registrys():
    from typing import get_args

    from precsearch.config.target import TargetName
    from precsearch.export.registry import TARGETS

    assert get_args(TargetName) == tuple(TARGETS) == ("precsearch", "megatron", "torchtitan", "accelerate")


def test_the_space_files_readings_are_the_registry():
    """``objectives.reading`` offers exactly the readings' registry (:mod:`precsearch.readings`), default first."""
    from typing import get_args

    from precsearch.config.space import ObjectivesSection, ReadingName
    from precsearch.readings import DEFAULT_READING, READING_NAMES

    assert get_args(ReadingName) == READING_NAMES == ("final", "tail", "damage")
    assert ObjectivesSection().reading == DEFAULT_READING
