"""The memory model's rule for compiled blocks (``precsearch/probe/memory/compiled.py``) against the H200.

Two recordings of 2026-12-03, both Hugging Face Llama blocks at the 8B width, seq 4096, FP32 parameters under
BF16 autocast, torchao's tensorwise Float8Linear, each block ``torch.compile``'d:

* ``2026-12-03_h200_torchao_saved.json``: what 2 compiled blocks saved for the backward, all BF16 and all FP8
  (the rule's counts come from it);
* ``2026-12-03_h200_bench_frameworks_call*``: whole training steps of 4 blocks with the vocabulary at 128,256,
  four policies, among them FP8 attention with BF16 MLPs, a block of a kind the listing did not have.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from precsearch.arch.config import PRESETS
from precsearch.arch.units import unit_names
from precsearch.precision import Precision
from precsearch.probe.memory.compiled import compiled_activation_bytes

RESULTS = Path(__file__).resolve().parents[3] / "scripts" / "results"
sys.path.insert(0, str(RESULTS.parent))

import frameworks_plan as plan  # noqa: E402

GIB = 2**30


def _compiled_rows() -> dict[str, dict]:
    rows = {}
    for name in ("call4_tt_compiled", "call5_tt"):
        for r in json.loads((RESULTS / f"2026-12-03_h200_bench_frameworks_{name}.json").read_text())["rows"]:
            if r["framework"] == "torchtitan" and "peak_gib" in r:
                rows[r["policy"]] = r
    return rows


def test_the_four_block_compiled_runs_are_predicted_within_half_a_percent_and_a_quarter_point():
    """Eager, the model read these peaks 3.5-5.8% high and their memory saved 0.4-2.3 points low."""
    rows = _compiled_rows()
    assert set(rows) == {"bf16", "fp8_current", "attn_current+mlp_delayed"}  # bf16_edges: in the next check
    shape = plan.Shape()
    predicted = {n: plan.predicted_peak_gib(plan.POLICIES[n], shape, "torchtitan") for n in rows}
    for name, r in rows.items():
        assert plan.compiled_run("torchtitan", r["note"]), r["note"]
        assert abs(predicted[name] / r["peak_gib"] - 1) < 0.005, (name, predicted[name], r["peak_gib"])
        measured = 1 - r["peak_gib"] / rows["bf16"]["peak_gib"]
        model = 1 - predicted[name] / predicted["bf16"]
        assert abs(100 * (model - measured)) < 0.25, (name, model, measured)
        eager = plan.predicted_peak_gib(plan.POLICIES[name], shape, "torchtitan", compiled=False)
        assert eager / r["peak_gib"] - 1 > 0.03  # what the rule corrects


def test_the_bf16_edges_run_of_the_merged_table_is_predicted_too():
    merged = json.loads((RESULTS / "2026-12-03_h200_bench_frameworks_torchtitan_compiled.json").read_text())
    rows = {r["policy"]: r for r in merged["rows"] if r["framework"] == "torchtitan"}
    edges, bf16 = rows["bf16_edges+fp8_current"], rows["bf16"]
    predicted = plan.predicted_peak_gib(plan.POLICIES["bf16_edges+fp8_current"], plan.Shape(), "torchtitan")
    assert abs(predicted / edges["peak_gib"] - 1) < 0.005
    base = plan.predicted_peak_gib(plan.POLICIES["bf16"], plan.Shape(), "torchtitan")
    assert abs(100 * ((1 - predicted / base) - (1 - edges["peak_gib"] / bf16["peak_gib"]))) < 0.25


@pytest.mark.parametrize("fp8", [False, True])
def test_the_rule_holds_the_two_block_listing_it_was_read_from(fp8):
    """Saved bytes of 2 compiled blocks (vocabulary 1024) with the output layer's weight cast and the loss's
    FP32 logits (outside the rule: weight copies and logits) added back: the listing's total to 0.1%."""
    listing = json.loads((RESULTS / "2026-12-03_h200_torchao_saved.json").read_text())
    [row] = [r for r in listing["rows"] if r["compiled"] and r["fp8"] is fp8]
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2, vocab_size=1024)
    precisions = {n: Precision.FP8_CURRENT if fp8 else Precision.BF16 for n in unit_names(cfg)}
    inputs, other = compiled_activation_bytes(cfg, precisions, seq_len=4096, micro_batch=1)
    block_weights = 0 if fp8 else 2 * (cfg.num_params() - 2 * cfg.vocab_size * cfg.dim)  # BF16 casts
    head_weight, fp32_logits = 2 * cfg.vocab_size * cfg.dim, 4 * 4096 * cfg.vocab_size
    total = inputs + other + block_weights + head_weight + fp32_logits
    assert abs(total / (row["saved_gib"] * GIB) - 1) < 0.001, (total / GIB, row["saved_gib"])


def test_the_rule_refuses_what_was_not_measured():
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=1)
    fp8 = {n: Precision.FP8_CURRENT for n in unit_names(cfg)}
    with pytest.raises(ValueError, match="param_dtype"):
        compiled_activation_bytes(cfg, {}, seq_len=16, micro_batch=1, param_dtype="bf16")
    with pytest.raises(ValueError, match="fp8_linear"):
        compiled_activation_bytes(cfg, fp8, seq_len=16, micro_batch=1, fp8_linear="te")
    compiled_activation_bytes(cfg, {}, seq_len=16, micro_batch=1, fp8_linear="te")  # BF16 only: no FP8 Linear


def test_eager_rows_are_told_apart_from_compiled_ones_by_their_note():
    assert plan.compiled_run("torchtitan") and plan.compiled_run("torchtitan", "... each decoder block torch.compile'd")
    assert not plan.compiled_run("torchtitan", "ran torchao's convert_to_float8_training with the exported filter")
    assert not plan.compiled_run("megatron") and not plan.compiled_run("accelerate")
    assert not plan.compiled_run("accelerate", "exported snippet, path ao")  # the eager rows of 2026-12-03


@pytest.mark.parametrize(("policy", "compiled"), [("bf16", True), ("fp8_current", True),
                                                  ("bf16_edges+fp8_current", True),
                                                  ("attn_current+mlp_delayed", False), ("mxfp8", False)])
def test_an_accelerate_run_is_compiled_where_its_setup_compiles_blocks(policy, compiled, tmp_path):
    """The bf16 and torchao setups ask for regional compilation; the TE and precsearch setups run eager."""
    files, _ = plan.export_files("accelerate", plan.POLICIES[policy], 4, tmp_path)
    asks = "use_regional_compilation=True" in files[plan.ACCELERATE_FILE].read_text()
    assert plan.compiled_run("accelerate", policy=plan.POLICIES[policy], layers=4) is compiled is asks


def test_a_compiled_run_with_bf16_parameters_has_no_prediction():
    """Accelerate's master-weights policy loads the model in BF16; the compiled rule was measured with FP32."""
    shape = plan.Shape()
    assert math.isnan(plan.predicted_peak_gib(plan.POLICIES["fp8_current+bf16_moments"], shape, "accelerate"))
    assert math.isfinite(plan.predicted_peak_gib(plan.POLICIES["fp8_current+bf16_moments"], shape, "accelerate",
                                                 compiled=False))
