"""scripts/bench_loss.py on CPU: both losses side by side, the bytes per logit and the agreement."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_loss  # noqa: E402


def test_the_bench_writes_both_rows_with_their_bytes_and_agreement(tmp_path, capsys):
    out = tmp_path / "loss.json"
    assert bench_loss.main(["--shapes", "128x4096", "--repeats", "1", "--device", "cpu", "--json", str(out)]) == 0
    rows = {r["loss_fn"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"precsearch", "F.cross_entropy"}
    assert 6 <= rows["precsearch"]["peak_bytes_per_logit"] < 6.5 <= 12 <= rows["F.cross_entropy"]["peak_bytes_per_logit"]
    assert rows["precsearch"]["loss_rel_diff"] < 1e-6 and rows["precsearch"]["max_grad_diff"] <= 2**-7
    assert rows["F.cross_entropy"]["time_vs_reference"] == 1.0
    assert "precsearch" in capsys.readouterr().out and out.with_suffix(".txt").exists()
