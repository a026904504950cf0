"""Start-up: the command line imports only what a command needs, when it needs it.

``precsearch --help`` (and ``import precsearch.cli``) must not pay for torch, Optuna, MLflow or
matplotlib (about 1.3 s of torch alone on a CPU machine, more with Transformer Engine): if this
fails, a module that the CLI imports at its top imports one of them at its own top.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "optuna", "mlflow", "matplotlib", "transformer_engine", "torchao")


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


def test_model_shapes_need_no_torch():
    """A space names and checks model shapes (arch.config is data only) without importing torch."""
    assert _imported_after("from precsearch.arch.config import PRESETS; PRESETS['tiny'].head_dim") == []
