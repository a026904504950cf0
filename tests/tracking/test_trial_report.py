"""A trial's run page artifacts: the policy table, the memory table, the loss chart."""

from __future__ import annotations

import io

from precsearch.policy import Policy
from precsearch.probe.result import ProbeResult
from precsearch.tracking.trial_report import loss_curves, memory_table, policy_table


def test_policy_table_is_blocks_by_units_with_each_precision():
    policy = Policy.from_dict({"rules": [
        {"name": "edge", "modules": ["*"], "precision": "bf16", "layers": {"first": 1}},
        {"name": "mlp", "modules": ["*.mlp.*"], "precision": "fp8_delayed"},
        {"name": "head", "modules": ["output_layer"], "precision": "fp8_current"}]})
    table = policy_table(policy, 3).splitlines()
    assert table[0] == "| block | linear_qkv | linear_proj | linear_fc1 | linear_fc2 |"
    assert table[2] == "| 0 | bf16 | bf16 | bf16 | bf16 |"  # the first block is kept in BF16
    assert table[3] == "| 1 | bf16 | bf16 | fp8_delayed | fp8_delayed |"
    assert table[5].startswith("| output_layer | fp8_current |")


def _result(losses, memory, eval_loss=3.0, fp8=None):
    return ProbeResult(losses=losses, grad_norms=[1.0] * len(losses), fp8_steps=fp8 or [True] * len(losses),
                       eval_loss=eval_loss, predicted_memory=memory, peak_memory_bytes=memory.get("total", 0))


def test_memory_table_compares_each_component_with_bf16():
    mine = _result([1.0], {"params": 2**20, "linear_inputs": 2**20, "total": 3 * 2**20})
    ref = _result([1.0], {"params": 2**20, "linear_inputs": 2 * 2**20, "total": 4 * 2**20})
    table = memory_table(mine, ref)
    assert "| linear_inputs | 1.00 | 2.00 | -50.0% |" in table
    assert "| total | 3.00 | 4.00 | -25.0% |" in table
    assert memory_table(mine, _result([1.0], {})) == ""


def _tables(text: str) -> list[list[tuple[str, float, float]]]:
    """Each Markdown table of ``text`` as (component, trial MiB, BF16 MiB) rows."""
    tables, rows = [], None
    for line in text.splitlines() + [""]:
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("| ") else None
        if cells and cells[0] != "component":
            rows.append((cells[0], float(cells[1]), float(cells[2])))
        elif cells is None and rows:
            tables, rows = tables + [rows], None
        elif cells:
            rows = []
    return tables


def test_each_memory_table_adds_up_to_its_total_and_the_larger_is_the_peak():
    """One list of every component added up to 43.36 MiB under a 40.12 MiB total (the gradients are not alive
    at the backward, and master was inside optimizer too): a reader adding the rows could not trust either."""
    from precsearch.precision import Precision
    from precsearch.probe.memory.peak import predict_peak
    from precsearch.arch.units import unit_names
    from precsearch.probe.model.llama3 import PRESETS

    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2, dim=256, n_heads=4, n_kv_heads=2, ffn_dim=512,
                                              vocab_size=1024)
    fp8 = {n: Precision.FP8_CURRENT for n in unit_names(cfg) if n != "output_layer"}
    mine, ref = (predict_peak(cfg, p, seq_len=256, micro_batch=2).to_dict() for p in (fp8, {}))
    table = memory_table(_result([1.0], mine), _result([1.0], ref))
    tables = _tables(table)
    assert len(tables) == 2, table
    for rows in tables:
        *parts, (total, trial_total, ref_total) = rows
        assert total.endswith("total**")
        assert abs(sum(r[1] for r in parts) - trial_total) <= 0.01 * len(parts), rows
        assert abs(sum(r[2] for r in parts) - ref_total) <= 0.01 * len(parts), rows
    peak = max(rows[-1][1] for rows in tables)
    assert abs(peak - mine["total"] / 2**20) < 0.01
    assert table.count("(trial: the peak)") == 1


def test_an_fp8_output_layer_gets_a_third_table_its_forward_which_holds_the_peak():
    from precsearch.arch.units import OUTPUT_LAYER
    from precsearch.precision import Precision
    from precsearch.probe.memory.peak import predict_peak
    from precsearch.probe.model.llama3 import PRESETS

    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2)
    mine, ref = (predict_peak(cfg, p, seq_len=4096, micro_batch=1, param_dtype="bf16").to_dict()
                 for p in ({OUTPUT_LAYER: Precision.FP8_CURRENT}, {}))
    table = memory_table(_result([1.0], mine), _result([1.0], ref))
    tables = _tables(table)
    assert len(tables) == 3 and "largest of three moments" in table, table
    assert "**During an FP8 output layer's forward** (trial: the peak)" in table
    for rows in tables:  # each adds up to its total here too
        *parts, (_, trial_total, ref_total) = rows
        assert abs(sum(r[1] for r in parts) - trial_total) <= 0.01 * len(parts), rows
    assert "largest of two moments" in memory_table(_result([1.0], ref), _result([1.0], ref))


def test_loss_curves_is_a_png_of_both_runs():
    import matplotlib.image

    png = loss_curves(_result([5.0, 4.0, 3.5, 3.2], {}, fp8=[False, True, True, True]),
                      _result([5.0, 3.9, 3.4, 3.1], {}, eval_loss=3.05), "trial 3:")
    assert png.startswith(b"\x89PNG")
    assert matplotlib.image.imread(io.BytesIO(png)).shape[0] > 100
