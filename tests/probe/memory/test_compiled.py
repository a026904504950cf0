"""The memory model's rule for compiled blocks (``precsearch/probe/memory/compiled.py``) against the H200.

Two recordings of 2026-12-03 (cut to what is read here, in ``tests/measured/``), both Hugging Face Llama
blocks at the 8B width, seq 4096, FP32 parameters under BF16 autocast, torchao's tensorwise Float8Linear,
each block ``torch.compile``'d:

* ``2026-12-03_h200_torchao_saved.json``: what 2 compiled blocks saved for the backward, all BF16 and all FP8
  (the rule's counts come from it);
* ``2026-12-03_h200_bench_frameworks_call*``: whole training steps of 4 blocks with the vocabulary at 128,256,
  four policies, among them FP8 attention with BF16 MLPs, a block of a kind the listing did not have.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from _measured import measurement

from precsearch.arch.config import PRESETS
from precsearch.arch.units import OUTPUT_LAYER, unit_names, unit_shape
from precsearch.precision import Precision
from precsearch.probe.memory.compiled import compiled_activation_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import frameworks_plan as plan  # noqa: E402
from _saved import saved_storage_bytes  # noqa: E402

GIB = 2**30


def _compiled_rows() -> dict[str, dict]:
    rows = {}
    for name in ("call4_tt_compiled", "call5_tt"):
        for r in measurement(f"2026-12-03_h200_bench_frameworks_{name}.json")["rows"]:
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
    merged = measurement("2026-12-03_h200_bench_frameworks_torchtitan_compiled.json")
    rows = {r["policy"]: r for r in merged["rows"] if r["framework"] == "torchtitan"}
    edges, bf16 = rows["bf16_edges+fp8_current"], rows["bf16"]
    predicted = plan.predicted_peak_gib(plan.POLICIES["bf16_edges+fp8_current"], plan.Shape(), "torchtitan")
    assert abs(predicted / edges["peak_gib"] - 1) < 0.005
    base = plan.predicted_peak_gib(plan.POLICIES["bf16"], plan.Shape(), "torchtitan")
    assert abs(100 * ((1 - predicted / base) - (1 - edges["peak_gib"] / bf16["peak_gib"]))) < 0.25



@pytest.mark.parametrize(("framework", "result"), [
    ("torchtitan", "2026-12-06_h100_bench_frameworks_torchtitan.json"),  # torchtitan 0.2.2 itself
    ("accelerate", "2026-12-06_h100_bench_frameworks_accelerate_compiled.json"),  # regional compilation
])
def test_the_frameworks_compiled_runs_of_2026_12_06_are_predicted(framework, result):
    """torchtitan's own blocks and Accelerate's regionally compiled ones (H100, 4 blocks): every peak within
    0.5% of the compiled rule's, memory saved within a quarter point; the torchtitan mixed row is the policy
    as torchtitan runs it (its delayed MLPs BF16)."""
    rows = {r["policy"]: r for r in measurement(result)["rows"]
            if r["framework"] == framework and "peak_gib" in r}
    assert {"bf16", "fp8_current", "bf16_edges+fp8_current"} <= set(rows)
    shape = plan.Shape()
    predicted = {n: plan.predicted_peak_gib(plan.POLICIES[n], shape, framework) for n in rows}
    for name, r in rows.items():
        assert plan.compiled_run(framework, r["note"]), r["note"]
        assert r["trained"]["moved"] == r["trained"]["matrices"], name
        # the mixed policy's delayed MLPs run BF16 in torchtitan's one converter, as its export warns
        assert all(want == "fp8_delayed" and ran == "bf16" for _, want, ran in r["modules"]["mismatches"]), name
        assert abs(predicted[name] / r["peak_gib"] - 1) < 0.005, (name, predicted[name], r["peak_gib"])
        measured = 1 - r["peak_gib"] / rows["bf16"]["peak_gib"]
        model = 1 - predicted[name] / predicted["bf16"]
        assert abs(100 * (model - measured)) < 0.25, (name, model, measured)


#: The 2-block listings of what compiled blocks save (``benchmarks/torchao_saved.py``): the Hugging Face blocks the
#: rule was read from (H200), and torchtitan 0.2.2's own blocks (H100, 2026-12-06), whose mixed policy (FP8
#: attention, BF16 MLP) checks the rule's inference of which unit keeps which input.
LISTINGS = {"hf": "2026-12-03_h200_torchao_saved.json", "torchtitan": "2026-12-06_h100_torchtitan_saved.json"}


def _two_block_precisions(cfg, policy: str) -> dict[str, Precision]:
    fp8 = {"bf16": (), "fp8_current": ("self_attention", "mlp"), "attn_current+mlp_delayed": ("self_attention",)}
    return {n: Precision.FP8_CURRENT if any(f".{part}." in n for part in fp8[policy]) else Precision.BF16
            for n in unit_names(cfg)}


def _listing_total(cfg, policy: str, seq: int, param_dtype: str = "fp32") -> int:
    """What a saved-tensor listing of ``cfg``'s compiled blocks should total: the rule, plus what it leaves to
    other parts of the model: the BF16 units' weight casts (FP32 parameters only), the output layer's weight
    (a cast, or with BF16 parameters a view the listing counts) and the loss's FP32 logits."""
    precisions = _two_block_precisions(cfg, policy)
    inputs, other = compiled_activation_bytes(cfg, precisions, seq_len=seq, micro_batch=1, param_dtype=param_dtype)
    casts = 0 if param_dtype == "bf16" else sum(
        2 * rows * cols for n, p in precisions.items() if n != OUTPUT_LAYER and p is Precision.BF16
        for rows, cols in [unit_shape(cfg, n)])
    return inputs + other + casts + 2 * cfg.vocab_size * cfg.dim + 4 * seq * cfg.vocab_size


@pytest.mark.parametrize(("model", "policy"), [("hf", "bf16"), ("hf", "fp8_current"), ("torchtitan", "bf16"),
                                               ("torchtitan", "fp8_current"),
                                               ("torchtitan", "attn_current+mlp_delayed")])
def test_the_rule_holds_the_two_block_listings(model, policy):
    """Saved bytes of 2 compiled blocks (vocabulary 1024) with what the rule leaves to other parts of the model
    added back (:func:`_listing_total`): the listing's total to 0.1% (HF) and 0.25% (torchtitan). torchtitan's final norm keeps one FP32 tensor fewer
    than the Hugging Face one (its listing's third FP32 token x dim tensor, where HF has four)."""
    listing = measurement(LISTINGS[model])
    [row] = [r for r in listing["rows"] if r["compiled"] and r.get("policy", "fp8_current" if r["fp8"] else "bf16")
             == policy]
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2, vocab_size=1024)
    total = _listing_total(cfg, policy, 4096)
    if model == "torchtitan":
        total -= 4 * 4096 * cfg.dim
    tolerance = 0.001 if model == "hf" else 0.0025
    assert abs(total / (row["saved_gib"] * GIB) - 1) < tolerance, (total / GIB, row["saved_gib"])
    assert row.get("hooks_error") is None


def test_the_rule_refuses_what_was_not_measured():
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=1)
    fp8 = {n: Precision.FP8_CURRENT for n in unit_names(cfg)}
    with pytest.raises(ValueError, match="param_dtype"):
        compiled_activation_bytes(cfg, {}, seq_len=16, micro_batch=1, param_dtype="fp16")
    with pytest.raises(ValueError, match="fp8_linear"):
        compiled_activation_bytes(cfg, fp8, seq_len=16, micro_batch=1, fp8_linear="te")
    compiled_activation_bytes(cfg, {}, seq_len=16, micro_batch=1, fp8_linear="te")  # BF16 only: no FP8 Linear


def test_eager_rows_are_told_apart_from_compiled_ones_by_their_note():
    assert plan.compiled_run("torchtitan") and plan.compiled_run("torchtitan", "... each decoder block torch.compile'd")
    assert not plan.compiled_run("torchtitan", "ran torchao's convert_to_float8_training with the exported filter")
    assert not plan.compiled_run("megatron")
    with pytest.raises(ValueError, match="policy and layers"):
        plan.compiled_run("accelerate")  # its setup decides
    assert not plan.compiled_run("accelerate", "exported snippet, path ao")  # the eager rows of 2026-12-03


@pytest.mark.parametrize(("policy", "compiled"), [("bf16", True), ("fp8_current", True),
                                                  ("bf16_edges+fp8_current", True),
                                                  ("attn_current+mlp_delayed", False), ("mxfp8", False)])
def test_an_accelerate_run_is_compiled_where_its_setup_compiles_blocks(policy, compiled, tmp_path):
    """The bf16 and torchao setups ask for regional compilation; the TE and precsearch setups run eager."""
    files, _ = plan.export_files("accelerate", plan.POLICIES[policy], 4, tmp_path)
    asks = "use_regional_compilation=True" in files[plan.ACCELERATE_FILE].read_text()
    assert plan.compiled_run("accelerate", policy=plan.POLICIES[policy], layers=4) is compiled is asks


def test_accelerates_compiled_knob_run_with_bf16_parameters_is_predicted():
    """The master-weights policy loads the model in BF16 (the export's warning); its blocks' rule came from the
    CPU listing below, and predicts the H100 run it was not fitted to (2026-12-06, 25.35 GiB)."""
    knobs_run = measurement("2026-12-06_h100_bench_frameworks_accelerate_knobs_compiled.json")
    rows = {r["policy"]: r for r in knobs_run["rows"]}
    shape = plan.Shape()
    knobs, bf16 = rows["fp8_current+bf16_moments"], rows["bf16"]
    assert plan.compiled_run("accelerate", knobs["note"]) and plan.param_dtype("accelerate", plan.POLICIES[
        "fp8_current+bf16_moments"].memory) == "bf16"
    predicted = plan.predicted_peak_gib(plan.POLICIES["fp8_current+bf16_moments"], shape, "accelerate")
    assert abs(predicted / knobs["peak_gib"] - 1) < 0.005, (predicted, knobs["peak_gib"])
    base = plan.predicted_peak_gib(plan.POLICIES["bf16"], shape, "accelerate")
    assert abs(100 * ((1 - predicted / base) - (1 - knobs["peak_gib"] / bf16["peak_gib"]))) < 0.25
    eager = plan.predicted_peak_gib(plan.POLICIES["fp8_current+bf16_moments"], shape, "accelerate", compiled=False)
    assert eager / knobs["peak_gib"] - 1 > 0.05  # what the rule corrects


def _saved_by_compiled_hf_blocks(param_dtype: str, fp8: bool) -> int:
    """Bytes a tiny Hugging Face Llama with compiled blocks saves for its backward, on the CPU
    (:func:`_saved.saved_storage_bytes`)."""
    transformers = pytest.importorskip("transformers")
    float8 = pytest.importorskip("torchao.float8")
    import torch

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=TINY.vocab_size, hidden_size=TINY.dim, intermediate_size=TINY.ffn_dim, num_hidden_layers=2,
        num_attention_heads=TINY.n_heads, num_key_value_heads=TINY.n_kv_heads, max_position_embeddings=256,
        tie_word_embeddings=False, attn_implementation="sdpa"))
    if param_dtype == "bf16":
        model = model.to(torch.bfloat16)
    if fp8:
        float8.convert_to_float8_training(model, config=float8.Float8LinearConfig.from_recipe_name("tensorwise"),
                                          module_filter_fn=lambda m, fqn: fqn.startswith("model.layers."))
    # a fresh compiler: earlier tests' compiles of the same block code count towards Dynamo's recompile limit,
    # past which the blocks would silently run eager (seen in the full suite)
    torch._dynamo.reset()
    for i, block in enumerate(model.model.layers):
        model.model.layers[i] = torch.compile(block)
    ids = torch.randint(0, TINY.vocab_size, (1, TINY_SEQ))

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(input_ids=ids, labels=ids).loss

    loss().backward()  # compile first: a compiling step's hooks would see the tracing
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "the blocks did not compile"
    value, saved = saved_storage_bytes(loss)
    value.backward()
    return saved


#: The CPU listing's model: two blocks as narrow as the 8B's proportions allow at these sizes, small vocabulary.
TINY = PRESETS["llama3-8b"].with_overrides(n_layers=2, vocab_size=64, dim=256, ffn_dim=512, n_heads=4, n_kv_heads=2)
TINY_SEQ = 128


@pytest.mark.parametrize("param_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("fp8", [False, True])
def test_the_rule_holds_compiled_blocks_listed_on_the_cpu(param_dtype, fp8):
    """The rule against what compiled Hugging Face blocks save, listed here on the CPU. With FP32 parameters the
    CPU's listing has the H200's counts; with BF16 parameters (an Accelerate master-weights run) the residual
    stream, the final norm's input and RoPE's tables are BF16 and no weight is cast (:func:`_listing_total`)."""
    total = _listing_total(TINY, "fp8_current" if fp8 else "bf16", TINY_SEQ, param_dtype)
    listed = _saved_by_compiled_hf_blocks(param_dtype, fp8)
    assert abs(total / listed - 1) < 0.005, (total, listed)
