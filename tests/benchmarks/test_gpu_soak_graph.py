"""On a GPU: the soak's emulated rows replayed as CUDA graphs train as the eager steps do.

What would be wrong if these failed: the emulated MXFP8 / NVFP4 / rowwise rows of docs/results/soak.md, which run
graphed to fit a session's device time, would not be the training their eager BF16 pairs and the package run.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_soak  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _small(steps: int) -> bench_soak.Setup:
    """The smoke shape on the GPU (``smoke`` False puts the run on CUDA)."""
    return replace(bench_soak.setup(steps, smoke=True), smoke=False, seq=64, mb=8)


@pytest.mark.parametrize("combo", ["bf16_std_emulated", "mxfp8_emulated", "fp8_rowwise_emulated"])
def test_at_the_smoke_size_a_replayed_step_gives_the_eager_losses_to_the_bit(combo):
    """At this size the captured GEMMs sum as the eager ones do. (At the soak's size cuBLAS picks other algorithms
    under capture for some BF16 GEMMs: the BF16 row's losses then differ in the last bits, see bench_soak.)"""
    [row] = bench_soak.graph_check([combo], _small(30))
    assert row["graphed"] is True
    assert row["max_loss_diff"] == 0.0


def _grads_of_two_replays(combo: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight's gradient after two replays of the same batch at the same weights."""
    s = _small(30)
    model, _ = bench_soak.build(bench_soak.COMBOS[combo], s, 0)
    ids, targets = bench_soak.batch(bench_soak.stdlib_bytes(), s, 0, 0, False, "cuda")
    step = bench_soak.GraphedStep(model, bench_soak.COMBOS[combo], s, ids, targets)
    weight = model.decoder.layers[0].mlp.linear_fc2.weight
    step(ids, targets)
    first = weight.grad.clone()
    step(ids, targets)
    return first, weight.grad.clone()


def test_nvfp4_replays_draw_fresh_stochastic_rounding_and_mxfp8_replays_repeat():
    """NVFP4 gradients round stochastically from the scalers' own streams: registered with the graph, each replay
    draws new numbers, so one batch at one set of weights gives another gradient; MXFP8 rounds to nearest."""
    first, second = _grads_of_two_replays("nvfp4_emulated")
    assert not torch.equal(first, second)
    assert abs(first.float().norm() - second.float().norm()) < 0.1 * first.float().norm()  # the same gradient, re-rounded
    assert torch.equal(*_grads_of_two_replays("mxfp8_emulated"))


def test_nvfp4_replayed_trains_as_the_eager_run_does():
    s = _small(30)
    eager, graphed = (bench_soak.train("nvfp4_emulated", 0, s, graph=g, keep_losses=True) for g in (False, True))
    assert graphed["cuda_graph"] is True
    assert eager["losses"][0] == graphed["losses"][0]  # step 0's forward draws nothing
    assert all(math.isfinite(x) for x in graphed["losses"])
    assert abs(graphed["losses"][-1] - eager["losses"][-1]) < 0.05 * eager["losses"][-1]
