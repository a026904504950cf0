"""Why torchtitan gets none of the optimizer knobs (issue 52, item 3), asserted against torchtitan's own code.

torchtitan 0.2.2's ``build_optimizers`` builds torch's ``Adam``/``AdamW`` by name only; a ``TrainSpec`` could
plug another class into its ``OptimizersContainer``, but torchtitan trains FSDP2 ``DTensor`` shards, which
precsearch's ``FP8StateAdamW`` cannot step. If these failed: torchtitan learnt to take another optimizer by
name, or ``FP8StateAdamW`` learnt DTensors (then the torchtitan export could ship it, and its target offer
the knobs); or a torchtitan space would be offered knobs its run silently drops.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from _spaces import tiny_space_dict
from precsearch.backends.fp8_state_adam import FP8StateAdamW
from precsearch.config.loader import parse_space
from precsearch.errors import UserErrors
from precsearch.runtime.target_space import check_target


def test_torchtitans_build_optimizers_takes_no_other_optimizer_by_name():
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (test extras)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from frameworks_torchtitan import import_torchtitan

    import_torchtitan()  # stubs the MoE Triton kernels where Triton is absent (the dense model never calls them)
    from torchtitan.components import optimizer
    from torchtitan.config import Optimizer as OptimizerConfig
    from torchtitan.distributed import ParallelDims

    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    built = optimizer.build_optimizers([nn.Linear(8, 8)], OptimizerConfig(name="AdamW", implementation="for-loop"),
                                       dims)
    assert all(type(o) is torch.optim.AdamW for o in built)
    with pytest.raises(NotImplementedError, match="FP8StateAdamW"):
        optimizer.build_optimizers([nn.Linear(8, 8)], OptimizerConfig(name="FP8StateAdamW"), dims)


def test_fp8stateadamw_refuses_an_fsdp2_shard_naming_it(tmp_path):
    """A one-rank gloo group: FSDP2's parameters are DTensors, which its steps and scales cannot read."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    # a file store, not a TCP port: a fixed port was taken by another test run on the same machine (EADDRINUSE)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.FileStore(str(tmp_path / "store"), 1))
    try:
        shard = distribute_tensor(torch.zeros(256, 4, dtype=torch.bfloat16), init_device_mesh("cpu", (1,)), [Shard(0)])
        with pytest.raises(ValueError, match="parameter 0 .* DTensor.*plain tensor"):
            FP8StateAdamW([nn.Parameter(shard)], exp_avg_dtype="fp8_block", exp_avg_sq_dtype="fp8_block")
    finally:
        dist.destroy_process_group()


def test_a_torchtitan_space_is_not_offered_optimizer_knobs_and_is_told_why():
    space = parse_space(tiny_space_dict(target={"name": "torchtitan"}, **{
        "probe.param_dtype": "bf16", "search.memory": {"moment_dtype": {"choices": ["param", "fp8_block"]}}}))
    with pytest.raises(UserErrors) as caught:
        check_target(space, file="space.yaml")
    line = next(str(p) for p in caught.value.problems if "search.memory.moment_dtype" in str(p))
    assert "offers fp8_block" in line and "target torchtitan (0.2.2)" in line
    assert "build_optimizers knows only torch's Adam and AdamW" in line and "FSDP2 DTensor" in line
