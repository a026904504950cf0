"""Start-up: the command line imports only what a command needs, when it needs it.

``precsearch --help`` (and ``import precsearch.cli``) must not pay for torch, Optuna, MLflow or
matplotlib (about 1.3 s of torch alone on a CPU machine, more with Transformer Engine): if this
fails, a module that the CLI imports at its top imports one of them at its own top.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HEAVY = ("torch", "optuna", "mlflow", "matplotlib", "transformer_engine", "torchao")
SPACES = Path(__file__).resolve().parents[1] / "search_spaces"


def _cpu_spaces() -> list[Path]:
    """The shipped spaces whose probes run on a CPU (``probe.device: cpu``) from scratch: validating one asks
    nothing of a GPU, and reads no model (one that starts from ``model.init_from`` reads its checkpoint)."""
    spaces = {path: yaml.safe_load(path.read_text()) for path in sorted(SPACES.glob("*.yaml"))}
    return [path for path, data in spaces.items()
            if (data.get("probe") or {}).get("device") == "cpu" and "init_from" not in (data.get("model") or {})]


def _imported_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_cli_module_imports_no_heavy_library():
    assert _imported_after("import precsearch.cli") == []


def test_help_imports_no_heavy_library():
    code = ("from precsearch.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass")
    assert _imported_after(code) == []


#: Packages whose import needs no torch, their ``__init__``'s re-exports (lazy where the module needs torch) included.
LIGHT_PACKAGES = ("precsearch", "precsearch.arch", "precsearch.backends", "precsearch.config", "precsearch.export",
                  "precsearch.policy", "precsearch.probe", "precsearch.probe.data", "precsearch.probe.measure",
                  "precsearch.probe.memory", "precsearch.probe.model", "precsearch.probe.parallel", "precsearch.runtime",
                  "precsearch.search", "precsearch.utils")


@pytest.mark.parametrize("package", LIGHT_PACKAGES)
def test_a_packages_public_names_cost_no_torch_until_used(package):
    """Re-exporting a package's names must not import the modules behind them (torch) at the package's import."""
    assert "torch" not in _imported_after(f"import {package}")


def test_model_shapes_need_no_torch():
    """A space names and checks model shapes (arch.config is data only) without importing torch."""
    assert _imported_after("from precsearch.arch.config import PRESETS; PRESETS['tiny'].head_dim") == []


def test_the_shipped_spaces_include_cpu_ones():
    """Else the test below would check nothing (the quickstart is the space a new user validates first)."""
    assert {"quickstart.yaml", "cpu_smoke.yaml"} <= {path.name for path in _cpu_spaces()}


@pytest.mark.parametrize("space", _cpu_spaces(), ids=lambda path: path.stem)
def test_validating_a_cpu_space_imports_no_torch(space):
    """``precsearch validate`` checks a CPU space (its fields, data, emulated backend) without torch: if this
    fails, a module on the validate path imports torch at its top (or a check builds tensors it need not)."""
    code = (f"from precsearch.cli import main\n"
            f"assert main(['validate', {str(space)!r}]) == 0, 'the shipped space does not validate'")
    assert "torch" not in _imported_after(code)


def test_validating_a_space_that_names_a_gpu_still_asks_torch():
    """The other side: a GPU space's checks do query the machine (is there a GPU?), through torch, lazily."""
    code = (f"from precsearch.cli import main\n"
            f"main(['validate', {str(SPACES / 'llama3_8b_h100.yaml')!r}])")
    assert "torch" in _imported_after(code)
