"""scripts/gpu_regime.py: its regime syntax and a CPU run on the smoke space.

If these fail, the H200 run that decides the 8B space's regime would run other regimes than it prints,
drop the gradient accumulation it was asked for, or lose its results.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from precsearch.config.space import ProbeSection, Space

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "gpu_regime.py"
_spec = importlib.util.spec_from_file_location("gpu_regime", _PATH)
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)
SMOKE = _PATH.parents[1] / "search_spaces" / "cpu_smoke.yaml"


def test_a_regime_overrides_only_what_it_names():
    space = Space(probe=ProbeSection(lr=1e-3, lr_warmup_steps=5, device="cpu"))
    assert script.parse_regime("today", space, 3) == ({"lr": 1e-3, "lr_warmup_steps": 5, "grad_accum": 1}, 3)
    assert script.parse_regime("lr=3e-4,accum=4,seeds=2", space, 3) == (
        {"lr": 3e-4, "lr_warmup_steps": 5, "grad_accum": 4}, 2)
    with pytest.raises(SystemExit, match="unknown key 'warm'"):
        script.parse_regime("warm=10", space, 3)


def test_cpu_run_writes_each_regime_and_skips_what_the_budget_cannot_hold(tmp_path, monkeypatch, capsys):
    out = tmp_path / "regime.json"
    monkeypatch.setattr(sys, "argv", ["gpu_regime.py", str(SMOKE), "--seeds", "2", "--set", "probe.steps=6",
                                      "--regime", "today", "--regime", "lr=1e-3,warmup=2,accum=2",
                                      "--regime", "accum=1000", "--budget-s", "30", "--json", str(out)])
    script.main()
    report = json.loads(out.read_text())
    today, accumulated = report["rows"]
    assert (today["tokens_per_step"], accumulated["tokens_per_step"]) == (4 * 32, 4 * 32 * 2)
    assert (accumulated["lr"], accumulated["lr_warmup_steps"], accumulated["grad_accum"]) == (1e-3, 2, 2)
    assert today["seeds"] == [0, 1] and len(today["per_seed"]) == 2 and today["seed_spread"] > 0
    assert isinstance(today["smooth"], bool) and today["step_s"] > 0
    assert report["skipped"] == ["accum=1000"]  # 500x the tokens of the last regime: far past a 30 s budget
    assert "smooth" in capsys.readouterr().out
