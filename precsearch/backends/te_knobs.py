"""Which memory knobs (:class:`~precsearch.policy.MemoryKnobs`) Transformer Engine can apply on a device.

Kept apart from :mod:`precsearch.backends.te` so the checks run without importing TE.
"""

from __future__ import annotations

import torch

from precsearch.backends.capability import gpu_capability, te_import_error
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Precision
from precsearch.storage import BLOCK_FP8
from precsearch.recipes import all_recipes

#: FP8 fused attention (cuDNN) needs Hopper or newer.
FP8_ATTENTION_MIN_CAPABILITY = (9, 0)
#: On Hopper TE 2.20 trains FP8 attention only with this head dimension (``fused_attn.cpp``: sm90
#: training needs d_qk = d_v = 128) and only under delayed scaling (current scaling: sm_100 or newer).
FP8_ATTENTION_HOPPER_HEAD_DIM = 128


def fp8_attention_precisions(capability: tuple[int, int] | None) -> tuple[Precision, ...]:
    """The q/k/v precisions whose blocks TE can run FP8 attention for, on a GPU of ``capability``."""
    if capability is None or capability < FP8_ATTENTION_MIN_CAPABILITY:
        return ()
    return tuple(r.precision for r in all_recipes()
                 if r.te_fp8_attention_from is not None and capability >= r.te_fp8_attention_from)


def fp8_attention_model_problem(head_dim: int, capability: tuple[int, int] | None) -> str | None:
    """Why TE cannot train FP8 attention at ``head_dim`` on this GPU, or None."""
    if capability is not None and capability < (10, 0) and head_dim != FP8_ATTENTION_HOPPER_HEAD_DIM:
        return (f"TE trains FP8 attention on Hopper only with head_dim {FP8_ATTENTION_HOPPER_HEAD_DIM} "
                f"(cuDNN FP8 fused attention); the model's head_dim is {head_dim}; valid here: off")
    return None


def te_memory_knob_problem(knobs: MemoryKnobs, device: torch.device) -> str | None:
    """None if the ``te`` backend applies ``knobs`` on ``device``; else why not, naming the knob."""
    if knobs.is_default:
        return None
    named = ", ".join(knobs.changed())
    if BLOCK_FP8 in knobs.moment_dtypes("bf16") and (knobs.fp8_weights or knobs.master == "fp16"):
        other = "fp8_weights=True" if knobs.fp8_weights else "master_dtype=fp16"
        return (f"fp8_block moments with {other}: only precsearch's FP8StateAdamW keeps fp8_block moments, and "
                "it steps neither FP8 weights nor FP16 masters (TE FusedAdam does, with moments fp32, bf16 or fp8)")
    if device.type != "cuda":
        return f"{named}: TE FusedAdam, FP8 weights and FP8 attention need a CUDA GPU (device is {device})"
    error = te_import_error()
    if error is not None:
        return f"{named}: {error}"
    if knobs.fp8_attention == "mha":
        return ("fp8_attention=mha: the probe applies FP8 attention to the attention core only (its RoPE runs "
                "between the q/k/v GEMM and attention, on BF16); valid here: off, dpa (exports still name mha)")
    if knobs.fp8_attention != "off":
        cap = gpu_capability(device)
        if cap is None or cap < FP8_ATTENTION_MIN_CAPABILITY:
            have = f"sm_{cap[0]}{cap[1]}" if cap else "no GPU"
            return (f"fp8_attention={knobs.fp8_attention}: TE's FP8 fused attention needs sm_90 (Hopper) or "
                    f"newer; {device} is {have}; valid here: off")
    return None
