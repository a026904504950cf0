"""How each training stack expresses a policy's memory knobs (:class:`~precsearch.policy.MemoryKnobs`).

One function per stack, each returning what it can write and a warning naming every knob it cannot.
Checked against the stacks' sources:

* Megatron-LM (``megatron/training/arguments.py``, ``megatron/core/optimizer/``):
  ``--use-precision-aware-optimizer`` with ``--exp-avg-dtype``/``--exp-avg-sq-dtype`` (fp32, fp16,
  bf16, fp8) and ``--main-params-dtype`` (fp32, fp16) hand the states to TE ``FusedAdam``;
  ``OptimizerConfig.store_param_remainders`` is True by default there and has no flag, so FP32
  main parameters are kept as BF16 + 16-bit remainders whenever the precision-aware optimizer
  is on and hands them to ``FusedAdam`` (no FP8, or ``--fp8-recipe delayed``; under the other
  recipes Megatron keeps whole FP32 main parameters itself); ``--fp8-param-gather`` keeps FP8 primary weights. Both the precision-aware optimizer
  (``megatron/core/optimizer/__init__.py``: "only supported with distributed optimizer") and
  ``--fp8-param-gather`` (``arguments.py``) need ``--use-distributed-optimizer``, so it comes
  with them. ``TransformerConfig``'s
  ``fp8_dot_product_attention``/``fp8_multi_head_attention`` are listed among the fields with no
  command-line flag.
* torchtitan 0.2.2 (``torchtitan/components/optimizer.py``, ``protocols/train_spec.py``): its float8
  converter (torchao) has no FP8 attention and no FP8 weight storage setting for this path, and
  ``build_optimizers`` builds torch's ``Adam`` or ``AdamW`` by name (states in the parameters' dtype, FP32
  under FSDP2 mixed precision). ``OptimizersContainer`` takes any optimizer class, and a registered
  ``TrainSpec``'s ``build_optimizers_fn`` could hand it precsearch's ``FP8StateAdamW``; but torchtitan
  trains FSDP2 ``DTensor`` shards, which that optimizer refuses (its ``fp8_block`` scales and kernels read
  whole plain tensors). So none of the optimizer knobs, and a space targeting torchtitan is not offered them.
* Accelerate and Hugging Face ``Trainer``: ``TERecipeKwargs`` carries no ``fp8_dpa``; the optimizer is the
  user's own, so ``policy.build_optimizer`` (TE ``FusedAdam``, or precsearch's ``FP8StateAdamW`` for FP8
  moments, as in the probe) applies the optimizer knobs: the Accelerate snippet says to build it, the
  Trainer set-up (:mod:`precsearch.export.hf_trainer`) builds it and passes it as ``optimizers=``.
"""

from __future__ import annotations

from dataclasses import replace

from precsearch.policy.rules import FP32_MASTER_AND_MOMENTS, MemoryKnobs
from precsearch.storage import BF16, BLOCK_FP8, FP32, TENSOR_FP8

#: Megatron's name for each precsearch moment dtype (``--exp-avg-dtype`` choices); ``fp8_block`` (precsearch's
#: own FP8StateAdamW) has no equivalent and goes out as the nearest one that trains: BF16, with a warning.
_MEGATRON_DTYPES = {FP32: "fp32", BF16: "bf16", TENSOR_FP8: "fp8", BLOCK_FP8: "bf16"}


def megatron_memory(memory: MemoryKnobs, fp8_recipe: str | None = None) -> tuple[list[str], list[str]]:
    """(flags, warnings) for Megatron-LM, which trains BF16 parameters with FP32 main parameters.

    ``fp8_recipe``: the exported ``--fp8-recipe`` (None without FP8). With FP32 main parameters and a
    recipe other than delayed, Megatron keeps the FP32 main copy itself instead of handing it to
    ``FusedAdam`` (``OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8`` is False), so
    there are no 16-bit remainders.
    """
    flags: list[str] = []
    warnings: list[str] = []
    if memory.fp8_weights:
        flags.append("--fp8-param-gather")  # FP8 primary weights (with FP32 main params in the optimizer)
    first, second = memory.moment_dtypes("fp32")  # "param" follows Megatron's FP32 default
    master = memory.master
    if (first, second) != ("fp32", "fp32") or master in ("fp16", "remainders"):
        flags.append("--use-precision-aware-optimizer")
        if (first, second) != ("fp32", "fp32"):
            flags += ["--exp-avg-dtype", _MEGATRON_DTYPES[first], "--exp-avg-sq-dtype", _MEGATRON_DTYPES[second]]
        mcore_master = fp8_recipe not in (None, "delayed")  # MCore keeps whole FP32 main params
        if master == "fp16":
            flags += ["--main-params-dtype", "fp16"]
        elif master == "remainders" and mcore_master:
            warnings.append(f"master_dtype=remainders: with --fp8-recipe {fp8_recipe} Megatron keeps whole FP32 "
                            "main parameters itself (no remainders: only delayed scaling or no FP8 hands them to "
                            "FusedAdam), 2 bytes/parameter more than the probe measured")
        elif master == "fp32" and not mcore_master:
            warnings.append("master_dtype=fp32: Megatron's precision-aware optimizer stores FP32 main parameters "
                            "as BF16 + 16-bit remainders (OptimizerConfig.store_param_remainders, True, no flag): "
                            "same values, 2 bytes/parameter less than the probe measured")
    if BLOCK_FP8 in (first, second):
        warnings.append("fp8_block moments: Megatron has no block-scaled FP8 optimizer state (its fp8 is TE "
                        "FusedAdam's per-tensor scale, whose second moment diverged on the 8B probe); exported "
                        "as bf16, 1 byte/parameter more per such moment than the probe measured")
    if "fp8" in (first, second):
        warnings.append("FP8 moments: Megatron steps them in TE FusedAdam, which dequantizes each to an FP32 copy, "
                        "runs its kernel and re-quantizes it tensor by tensor: the same numbers as the probe's fused "
                        "FP8StateAdamW, but a slower step and FP32 copies of a param group's moments at the step "
                        "(docs/memory.md, why FP8 moments can raise the peak)")
    if flags:  # Megatron refuses both the precision-aware optimizer and --fp8-param-gather without it
        flags.append("--use-distributed-optimizer")
    if not memory.uses_master_weights and memory.moment_dtype != "param":
        warnings.append("the policy trained without FP32 master weights; Megatron keeps FP32 main parameters "
                        "in BF16 training, so it will use more memory than the probe measured")
    if memory.fp8_attention != "off":
        field = "fp8_multi_head_attention" if memory.fp8_attention == "mha" else "fp8_dot_product_attention"
        warnings.append(f"fp8_attention={memory.fp8_attention}: Megatron has no command-line flag for it; set "
                        f"TransformerConfig.{field}=True in your model provider (megatron/training/arguments.py "
                        "lists it among the fields with no CLI argument)")
    return flags, warnings


def megatron_written(memory: MemoryKnobs, fp8_recipe: str | None = None) -> MemoryKnobs:
    """The training state Megatron keeps under :func:`megatron_memory`'s flags, as memory knobs.

    Block-scaled moments go out as BF16; master weights are whole FP32 unless the precision-aware
    optimizer hands them to ``FusedAdam`` (no FP8, or ``--fp8-recipe delayed``), which keeps BF16 +
    16-bit remainders; a policy without master weights but with its own moment dtype gets Megatron's FP32
    main parameters; a policy with no optimizer knob gets Megatron's default state, FP32 main parameters and
    moments (no flag is written); FP8 attention has no flag (see the warnings there).
    """
    if memory.optimizer_knobs.is_default:
        return FP32_MASTER_AND_MOMENTS
    first, second = memory.moment_dtypes("fp32")
    master = memory.master
    aware = (first, second) != ("fp32", "fp32") or master in ("fp16", "remainders")
    if not memory.uses_master_weights and memory.moment_dtype != "param":
        master = "fp32"  # Megatron keeps FP32 main parameters in BF16 training
    if master in ("fp32", "remainders"):
        master = "remainders" if aware and fp8_recipe in (None, "delayed") else "fp32"
    return replace(memory, master_weights=master != "none", master_dtype="fp32" if master == "none" else master,
                   moment_dtype=_MEGATRON_DTYPES.get(memory.moment_dtype, memory.moment_dtype),
                   exp_avg_dtype=memory.exp_avg_dtype and _MEGATRON_DTYPES[memory.exp_avg_dtype],
                   exp_avg_sq_dtype=memory.exp_avg_sq_dtype and _MEGATRON_DTYPES[memory.exp_avg_sq_dtype],
                   fp8_attention="off")


def torchtitan_memory(memory: MemoryKnobs) -> list[str]:
    """Warnings for the knobs torchtitan's TOML cannot express (it can express none of them)."""
    lost = memory.changed()
    if not lost:
        return []
    return [f"{', '.join(lost)}: torchtitan cannot express these memory settings (its build_optimizers knows "
            "only torch's Adam and AdamW, which keep states in the parameters' dtype; a TrainSpec may plug in "
            "another optimizer, but precsearch's FP8StateAdamW steps plain tensors, not the FSDP2 DTensor shards "
            "torchtitan trains, so precsearch ships none; its float8 converter has no FP8 weight storage or FP8 "
            "attention here); training uses more memory than the probe measured"]


def torchtitan_written(memory: MemoryKnobs) -> MemoryKnobs:
    """The training state torchtitan keeps: none of the knobs (AdamW on the parameters, BF16 attention)."""
    return MemoryKnobs()


def accelerate_written(memory: MemoryKnobs) -> MemoryKnobs:
    """The training state of the Accelerate snippet: the optimizer knobs (``policy.build_optimizer``), no FP8
    attention."""
    return memory.optimizer_knobs


def accelerate_memory(memory: MemoryKnobs) -> list[str]:
    """Warnings for Accelerate: the optimizer knobs go through ``policy.build_optimizer``, FP8 attention cannot."""
    warnings = []
    if not memory.optimizer_knobs.is_default:
        warnings.append(f"{', '.join(memory.optimizer_knobs.changed())}: Accelerate has no setting for them; the "
                        "snippet builds precsearch's optimizer with policy.build_optimizer (FP8StateAdamW for FP8 "
                        "moments, on any device; else TE FusedAdam, a CUDA GPU), as hf_trainer_fp8.py does for a "
                        "Trainer: an optimizer of your own would drop them")
    if memory.master != "none":
        warnings.append(f"master weights ({memory.master}) keep a copy of BF16 parameters: load the model in BF16 "
                        "(from_pretrained(..., torch_dtype=torch.bfloat16)) before building the optimizer; on the "
                        "FP32 parameters a Hugging Face model loads by default the master is a second FP32 copy")
    if memory.fp8_attention != "off":
        warnings.append(f"fp8_attention={memory.fp8_attention}: Accelerate's TERecipeKwargs has no fp8_dpa "
                        "setting; attention stays BF16 (more activation memory than the probe measured)")
    return warnings


def trainer_memory(memory: MemoryKnobs) -> list[str]:
    """Warnings for the Trainer set-up: its optimizer is precsearch's, so only FP8 attention is lost."""
    if memory.fp8_attention == "off":
        return []
    return [f"fp8_attention={memory.fp8_attention}: precsearch's Python API applies FP8 attention to its probe's "
            "Transformer Engine attention only; a LlamaForCausalLM's attention stays BF16 (more activation memory "
            "than the probe measured)"]
