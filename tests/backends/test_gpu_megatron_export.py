"""The Megatron export run in Megatron-Core: every TE module runs the recipe the policy gives it (H200).

A 2-block ``GPTModel`` (TE layer spec) built from the exported flags (``TransformerConfig`` fields) and
precision config (``quant_recipe``), trained two steps with Megatron's own DDP and optimizer; then each
``decoder.layers.{i}.*`` TE module's latest forward (``module.fp8``, ``fp8_meta["recipe"]``) is compared with
the policy. Skipped without CUDA, or without megatron-core (``benchmarks/gpu/gpu_frameworks.sh`` unpacks it).
Run as ``bash benchmarks/gpu/gpu_frameworks.sh`` (it runs this file first).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("transformer_engine.pytorch")
pytest.importorskip("megatron.core.models.gpt")

import frameworks_plan as plan  # noqa: E402
import frameworks_runs as runs  # noqa: E402

SHAPE = plan.Shape(layers=2, dim=512, ffn=1536, heads=8, kv_heads=4, vocab=1024, seq=256, mb=2, steps=4,
                   warmup_steps=1)
#: The policies a Hopper GPU runs (MXFP8 is checked as not runnable below).
RUNNABLE = ["bf16", "fp8_current", "attn_current+mlp_delayed", "bf16_edges+fp8_current", "fp8_current+bf16_moments"]


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory):
    """name -> (model, result of two training steps) for each runnable policy, in one process group."""
    out = {}
    for name in RUNNABLE:
        policy = plan.POLICIES[name]
        export_dir = tmp_path_factory.mktemp(name.replace("+", "_"))
        plan.export_files("megatron", policy, SHAPE.layers, export_dir)
        mplan = plan.megatron_plan(policy, SHAPE.layers)
        model, config = runs.megatron_model(SHAPE, mplan, export_dir)
        ddp, opt = runs.megatron_optimizer(model, config, mplan)
        data = runs.batches(SHAPE, "cuda")
        pos = torch.arange(SHAPE.seq, device="cuda").unsqueeze(0).expand(SHAPE.mb, -1)
        losses = []
        for ids, targets in data[:2]:
            ddp.zero_grad_buffer()
            opt.zero_grad()
            loss = ddp(ids, pos, None, labels=targets).float().mean()
            loss.backward()
            ddp.finish_grad_sync()
            opt.step()
            losses.append(loss.item())
        out[name] = (model, opt, losses)
    return out


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_te_module_ran_the_policys_recipe(megatron_run, name):
    """A module on another recipe means a flag or matcher of the export is not what Megatron reads."""
    model, _, losses = megatron_run[name]
    observed = runs.te_observed(model)
    expected = plan.megatron_expected(plan.POLICIES[name], SHAPE.layers)
    check = plan.check_modules(observed, expected)
    assert check["modules"] == 4 * SHAPE.layers and check["ok"] == check["modules"], check["mismatches"]
    assert all(math.isfinite(x) for x in losses) and abs(losses[0] - math.log(SHAPE.vocab)) < 1.0, losses


def test_the_per_module_mix_runs_two_recipes(megatron_run):
    """attention tensorwise and MLP delayed must both be seen, or the mix collapsed onto the global recipe."""
    observed = runs.te_observed(megatron_run["attn_current+mlp_delayed"][0])
    assert observed["decoder.layers.0.self_attention.linear_qkv"] == "fp8_current"
    assert observed["decoder.layers.1.mlp.linear_fc2"] == "fp8_delayed"


def test_bf16_moment_flags_reach_megatrons_precision_aware_optimizer(megatron_run):
    """The memory-knob flags must build Megatron's distributed, precision-aware optimizer with BF16 moments."""
    _, opt, _ = megatron_run["fp8_current+bf16_moments"]
    config = opt.config if hasattr(opt, "config") else opt.chained_optimizers[0].config
    assert config.use_distributed_optimizer and config.use_precision_aware_optimizer
    assert config.exp_avg_dtype == torch.bfloat16 and config.exp_avg_sq_dtype == torch.bfloat16


def test_mxfp8_is_reported_not_runnable_on_hopper():
    """On sm_90 the bench must say MXFP8 cannot run there instead of training something else."""
    cap = torch.cuda.get_device_capability()
    why = plan.not_runnable(plan.POLICIES["mxfp8"], SHAPE.layers, cap)
    assert (why is not None) == (cap < (10, 0))
