"""The memory a study's target saves running a trial's policy, as the target runs it (predicted).

What the target runs is its export's reading of its files (:func:`~precsearch.export.registry.as_run`); its peak
is precsearch's memory model (:func:`~precsearch.probe.memory.peak.predict_peak`) at the study's target model
with the framework's rules where the model has them (:mod:`precsearch.probe.memory.frameworks`): Megatron-Core's
standard optimizer (persistent gradient buffer, FP32 main-gradient copy) and TE ``FusedAdam``'s FP32 copies of
FP8 moments; torchao's ``Float8Linear`` and torchtitan's compiled blocks; Accelerate's torchao setup with its
regional compilation; Hugging Face's and torchtitan's FP32 cross-entropy. The saving is against BF16 run alike
(the study's ``objectives.baseline_memory``, the same framework rules). Speed is not predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from precsearch.config.space import BaselineMemory, ModelSection, ProbeSection
from precsearch.export.accelerate import choose_path
from precsearch.export.registry import TARGETS, as_run
from precsearch.policy.rules import MemoryKnobs, Policy
from precsearch.probe.memory.frameworks import framework_peak
from precsearch.probe.memory.peak import predict_peak


@dataclass(frozen=True)
class TargetRun:
    """How the memory model counts one target's run.

    Attributes:
        framework: The rule of :data:`~precsearch.probe.memory.frameworks.FRAMEWORK_PEAKS` (``probe``: none).
        fp8_linear: Which FP8 Linear runs the FP8 units (``te`` or ``torchao``).
        compiled: Whether each block runs under ``torch.compile``.
    """

    framework: str
    fp8_linear: str = "te"
    compiled: bool = False


def target_run(target: str, policy: Policy, n_layers: int) -> TargetRun:
    """How ``target`` runs ``policy``: torchtitan compiles its blocks around torchao's Float8Linear; the
    Accelerate snippet does so on its BF16 and torchao setups (its other setups run TE or precsearch, eager)."""
    if target == "torchtitan":
        return TargetRun("torchtitan", "torchao", True)
    if target == "accelerate":
        path = choose_path(policy, n_layers)[0]
        return TargetRun("accelerate", "torchao" if path == "ao" else "te", path in ("bf16", "ao"))
    return TargetRun("megatron" if target == "megatron" else "probe")


def target_memory_saved(space: dict[str, Any], target: str, policy: Policy) -> float:
    """``1 - peak / BF16 peak`` of ``target``'s run of ``policy`` at the stored ``space``'s target model."""
    cfg = ModelSection(**space["model"]).target()
    probe = ProbeSection(**space["probe"])
    written = as_run(TARGETS[target], policy, cfg.n_layers)
    stored = (space.get("objectives") or {}).get("baseline_memory") or {}
    baseline = MemoryKnobs(**BaselineMemory(**stored).model_dump()).resolved(probe.param_dtype)
    how = target_run(target, policy, cfg.n_layers)

    def peak(precisions: dict, memory: MemoryKnobs, run: TargetRun) -> int:
        fp8_moments = "fp8" in memory.moment_dtypes(probe.param_dtype) and run.framework == "megatron"
        b = predict_peak(cfg, precisions, seq_len=probe.seq_len, micro_batch=probe.micro_batch,
                         param_dtype=probe.param_dtype, memory=memory, grad_accum=probe.grad_accum,
                         fp8_linear=run.fp8_linear, fused_adam_fp8=fp8_moments, compiled_blocks=run.compiled)
        return framework_peak(run.framework, b, memory)

    bf16 = replace(how, compiled=how.compiled or target == "accelerate")  # its BF16 setup compiles its blocks
    return 1.0 - peak(written.precisions, written.memory, how) / peak({}, baseline, bf16)


__all__ = ["TargetRun", "target_memory_saved", "target_run"]
