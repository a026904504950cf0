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
