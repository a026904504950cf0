"""Exports of the memory knobs: Megatron's precision-aware optimizer flags, and warnings naming what a stack lacks.

What would be wrong if these failed: a policy searched with FP8 moments would train in Megatron with
FP32 moments (more memory than measured, other numerics) without a word, or a flag name would not be
one Megatron's ``arguments.py`` parses.
"""

from __future__ import annotations

from precsearch.export.accelerate import accelerate_files
from precsearch.export.megatron import megatron_export
from precsearch.export.memory_knobs import accelerate_memory, megatron_memory, torchtitan_memory
from precsearch.export.torchtitan import torchtitan_export
from precsearch.policy import MemoryKnobs, Policy
from precsearch.precision import Precision

FP8_STATE = MemoryKnobs(master_weights=True, moment_dtype="bf16", exp_avg_dtype="fp8", master_dtype="remainders")


def test_megatron_gets_the_precision_aware_optimizer_with_each_moment_dtype():
    flags, warnings = megatron_memory(FP8_STATE)
    assert flags == ["--use-precision-aware-optimizer", "--exp-avg-dtype", "fp8", "--exp-avg-sq-dtype", "bf16",
                     "--use-distributed-optimizer"]  # Megatron raises without it
    # remainders are Megatron's default under the precision-aware optimizer; its FP8 moments step in FusedAdam
    assert len(warnings) == 1 and warnings[0].startswith("FP8 moments: Megatron steps them in TE FusedAdam")
    assert megatron_memory(MemoryKnobs(master_weights=True, moment_dtype="bf16", master_dtype="remainders"))[1] == []


def test_megatron_fp16_master_and_remainder_default():
    flags, _ = megatron_memory(MemoryKnobs(master_weights=True, moment_dtype="fp32", master_dtype="fp16"))
    assert flags == ["--use-precision-aware-optimizer", "--main-params-dtype", "fp16", "--use-distributed-optimizer"]
    flags, warnings = megatron_memory(MemoryKnobs(master_weights=True, moment_dtype="fp8"))
    assert "--exp-avg-dtype" in flags and any("store_param_remainders" in w for w in warnings)


def test_remainders_under_a_non_delayed_recipe_warn_that_megatron_keeps_whole_fp32_masters():
    """Megatron hands FP32 main params to FusedAdam (and so keeps remainders) only without FP8 or with delayed
    scaling (OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8)."""
    _, warnings = megatron_memory(FP8_STATE, "tensorwise")
    assert any("master_dtype=remainders" in w and "tensorwise" in w for w in warnings), warnings
    assert not any("master_dtype" in w for w in megatron_memory(FP8_STATE, "delayed")[1])
    _, warnings = megatron_memory(MemoryKnobs(master_weights=True, moment_dtype="fp8"), "blockwise")
    assert not any("store_param_remainders" in w for w in warnings)  # whole FP32 masters, as the probe's


def test_fp8_param_gather_comes_with_the_distributed_optimizer():
    flags, _ = megatron_memory(MemoryKnobs(fp8_weights=True))
    assert flags == ["--fp8-param-gather", "--use-distributed-optimizer"]


def test_the_standard_optimizer_needs_no_megatron_flag():
    assert megatron_memory(MemoryKnobs(master_weights=True, moment_dtype="fp32")) == ([], [])


def test_fp8_attention_has_no_megatron_flag_and_says_which_config_field_to_set():
    _, warnings = megatron_memory(MemoryKnobs(fp8_attention="dpa"))
    assert any("fp8_attention=dpa" in w and "fp8_dot_product_attention" in w for w in warnings)
    _, warnings = megatron_memory(MemoryKnobs(fp8_attention="mha"))
    assert any("fp8_multi_head_attention" in w for w in warnings)


def test_megatron_export_carries_the_memory_flags():
    flags, _, _ = megatron_export(Policy(default=Precision.FP8_DELAYED, memory=FP8_STATE), 4)
    assert "--use-precision-aware-optimizer" in flags and "--exp-avg-dtype" in flags


def test_torchtitan_warns_naming_every_knob_it_cannot_express():
    _, warnings = torchtitan_export(Policy(default=Precision.FP8_CURRENT, memory=FP8_STATE), 4)
    lost = [w for w in warnings if "memory settings" in w]
    assert len(lost) == 1 and all(k in lost[0] for k in ("exp_avg_dtype=fp8", "master_dtype=remainders"))
    assert torchtitan_memory(MemoryKnobs()) == []


def test_accelerate_points_the_optimizer_knobs_to_build_optimizer_and_warns_on_fp8_attention():
    memory = MemoryKnobs(master_weights=True, moment_dtype="fp8", fp8_attention="dpa")
    warnings = accelerate_memory(memory)
    assert any("policy.build_optimizer" in w and "moment_dtype=fp8" in w for w in warnings)
    assert any("fp8_attention=dpa" in w and "TERecipeKwargs" in w for w in warnings)
    rendered = accelerate_files(Policy(default=Precision.FP8_DELAYED, memory=memory), 4, {})
    assert any("fp8_attention=dpa" in w for w in rendered.warnings)


def test_accelerate_warns_that_master_weights_need_a_bf16_model():
    """A Hugging Face model loads FP32 parameters; there the master copy doubles them (H200, 2026-12-03)."""
    assert any("torch_dtype=torch.bfloat16" in w for w in accelerate_memory(MemoryKnobs(master_weights=True)))
    assert any("torch_dtype" in w for w in accelerate_memory(MemoryKnobs(fp8_weights=True)))
    assert not any("torch_dtype" in w for w in accelerate_memory(MemoryKnobs(moment_dtype="bf16")))


def test_fp8_block_moments_go_to_megatron_as_bf16_with_a_warning():
    flags, warnings = megatron_memory(MemoryKnobs(master_weights=True, moment_dtype="fp8_block",
                                                  master_dtype="remainders"))
    for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype"):
        assert flags[flags.index(flag) + 1] == "bf16"
    assert any(w.startswith("fp8_block moments: Megatron has no block-scaled") for w in warnings)


def test_megatron_runs_a_policy_without_optimizer_knobs_with_its_default_fp32_master_and_moments():
    """No knob writes no optimizer flag, and Megatron then keeps FP32 main parameters and moments. Read as the
    knobs were (none), a Megatron study of BF16 parameters scored a trial with every GEMM in BF16 as saving 45%
    at 4 blocks of the 8B width, where Megatron saves nothing."""
    from precsearch.config.loader import load_space
    from precsearch.export.memory_knobs import megatron_written
    from precsearch.policy import Policy
    from precsearch.policy.rules import FP32_MASTER_AND_MOMENTS, MemoryKnobs
    from precsearch.runtime.target_memory import target_saving

    assert megatron_written(MemoryKnobs()) == FP32_MASTER_AND_MOMENTS
    assert megatron_written(MemoryKnobs(fp8_attention="dpa")) == FP32_MASTER_AND_MOMENTS  # no flag for it either
    space = load_space("search_spaces/llama3_8b_h100_megatron.yaml").model_dump(mode="json")
    assert target_saving(space, "megatron", Policy(clip_grad=1.0), 4).saved == 0.0
    knobs = MemoryKnobs(master_weights=True, master_dtype="remainders", moment_dtype="bf16")
    assert target_saving(space, "megatron", Policy(clip_grad=1.0, memory=knobs), 4).saved > 0.3
