"""benchmarks/bench_real_weights.py on a tiny GGUF: the checkpoint's held-out losses, every policy row, the outliers.

The file is written by tests/_gguf.py with one planted outlier: channel 5 of the final norm's weight at 1000,
so the output layer's GEMM input has one channel ~1000x the others (a massive activation), which the
random init of the same shape does not have.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_real_weights as bench  # noqa: E402
from _gguf import hf_state, write_llama_gguf  # noqa: E402

pytest.importorskip("gguf")
ARGS = ["--text-bytes", "30000", "--max-tokens", "30000", "--seq-len", "32", "--micro-batch", "2",
        "--eval-batches", "2"]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    state = hf_state(seed=1)
    state["model.norm.weight"][5] = 1000.0
    write_llama_gguf(path, state)
    return path


@pytest.fixture(scope="module")
def result(gguf, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("out") / "rw.json"
    assert bench.main(["--gguf", str(gguf), *ARGS, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_real_rows_score_the_checkpoint_on_the_probes_held_out_batches(gguf, result):
    """The BF16 losses are the probe's own held-out losses of the checkpoint (the runner's eval path): else the
    bench scored other weights (the random init) or other tokens than a study of the same space."""
    from precsearch.arch.gguf_checkpoint import read_config
    from precsearch.arch.hf_checkpoint import CheckpointStart
    from precsearch.backends import get_backend
    from precsearch.probe.model.checkpoint_init import init_from_checkpoint
    from precsearch.probe.model.llama3 import build_model
    from precsearch.probe.runner import eval_losses

    cfg = read_config(gguf)
    model = build_model(cfg, 0)
    init_from_checkpoint(model, CheckpointStart(gguf, (0, 1)))
    data = bench.held_out(bench.parse_args(ARGS))
    expected = eval_losses(model, data, get_backend("emulated", torch.device("cpu")), torch.device("cpu"), False)
    torch.testing.assert_close(result["inits"]["real"]["bf16_losses"], expected, rtol=1e-6, atol=0)
    assert result["inits"]["random"]["bf16_losses"] != pytest.approx(expected, rel=1e-3)


def test_every_policy_has_both_operands_one_operand_and_both_delayed_starts(result):
    """5 policies x (both, weight, input), delayed once cold and once warm, and the control: 19 rows per init,
    each with a per-batch change that is the loss against BF16 in %."""
    for init in ("real", "random"):
        res = result["inits"][init]
        assert len(res["rows"]) == 4 * 3 + 3 * 2 + 1
        assert {k.split("/")[2] for k in res["rows"] if k.startswith("e_")} == {"cold", "warm"}
        for row in res["rows"].values():
            expected = [100 * (x - r) / r for x, r in zip(row["losses"], res["bf16_losses"])]
            assert row["change_pct"] == pytest.approx(expected) and len(expected) == 2
            assert row["min_pct"] <= row["mean_pct"] <= row["max_pct"]
    # FP8 on every Linear moves the loss: a row equal to BF16 would mean the policy was never applied
    assert result["inits"]["real"]["rows"]["a_all_current/both/-"]["change_pct"] != [0.0, 0.0]


def test_the_planted_massive_activation_tops_the_table_on_the_real_weights_only(result):
    """The output layer's input carries channel 5 at ~1000x: it must top the amax/RMS table, at channel 5, far
    above the random init's same module; a hook on another tensor than the GEMM's input (the residual stream)
    would miss it."""
    top = result["top"]
    assert top[0]["module"] == "output_layer" and top[0]["real"]["channel"] == 5
    assert top[0]["real"]["amax_over_rms"] > 15 > 8 > top[0]["random"]["amax_over_rms"]
    ratios = [row["real"]["amax_over_rms"] for row in top]
    assert ratios == sorted(ratios, reverse=True) and len(top) == 9  # 2 blocks x 4 units + the output layer
    assert all(row["real"]["amax"] >= row["real"]["rms"] > 0 for row in top)


def test_bf16_rounding_in_both_roles_is_the_bf16_gemm_up_to_the_order_of_sums(gguf, result):
    """The one-operand rows round the other operand to BF16 as the BF16 GEMM does: with both roles so rounded,
    the converted layers compute the BF16 GEMM but for the order of their float32 sums (a native BF16 GEMM may
    sum otherwise), so the control row's change is a small fraction of any FP8 row's; else the split would blame
    FP8 for a difference of its own. On the random init: the planted outlier's logits of ~1000 turn a last-bit
    difference into a visible loss difference."""
    args = bench.parse_args(ARGS)
    plain = bench.plain_models(gguf, 0)["random"]
    data, backend = bench.held_out(args), bench.get_backend("emulated", torch.device("cpu"))
    model = bench.converted(plain, bench.POLICIES["a_all_current"][1], backend, "neither")
    layers = bench._fp8_layers(model)
    assert len(layers) == 9 and all(isinstance(m.input_scaler, bench.Bf16Rounding) and
                                    isinstance(m.weight_scaler, bench.Bf16Rounding) for m in layers)
    batch = data.eval_set()[0]
    emulated = bench.batch_loss(model, backend, batch, fp8_on=True)
    assert emulated == pytest.approx(bench.batch_loss(plain, backend, batch, fp8_on=False), rel=1e-3)
    assert abs(result["inits"]["random"]["rows"]["control/neither/-"]["mean_pct"]) < 0.1


def test_every_held_out_batch_starts_delayed_scaling_from_the_same_state(gguf):
    """Cold rows give each batch fresh scalers (scale 1): a batch's loss does not depend on the batches before it,
    so it equals that batch alone on a freshly converted model."""
    args = bench.parse_args(ARGS)
    plain = bench.plain_models(gguf, 0)["real"]
    data, backend = bench.held_out(args), bench.get_backend("emulated", torch.device("cpu"))
    policy = bench.POLICIES["e_blocks_delayed"][1]
    losses = bench.policy_losses(bench.converted(plain, policy, backend, "both"), backend, data, "cold")
    alone = bench.batch_loss(bench.converted(plain, policy, backend, "both"), backend, data.eval_set()[1], True)
    assert losses[1] == alone
    warm = bench.policy_losses(bench.converted(plain, policy, backend, "both"), backend, data, "warm")
    assert warm != losses  # the warm start's scales come from a training window's amax, not 1
