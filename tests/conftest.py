"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _spaces import tiny_space_dict, write_space

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


@pytest.fixture
def tiny_space_file(tmp_path: Path) -> Path:
    return write_space(tmp_path, tiny_space_dict())


@pytest.fixture
def unsoaked_nvfp4(monkeypatch):
    """NVFP4 as a recipe no long run has run (its failed row forgotten): every recipe precsearch has has passed its
    soak or was refused by it (``validate`` refuses NVFP4, opt-in or not), and a new one starts unsoaked. For
    tests of the unsoaked path, and of checks a space offering NVFP4 meets besides the soak's."""
    from precsearch.precision import Precision
    from precsearch.recipes import recipe_for

    monkeypatch.setattr(type(recipe_for(Precision.NVFP4)), "soak_refused", "")
