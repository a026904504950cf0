"""The memory a study's target saves running a trial's policy, as the target runs it (predicted).

What the target runs is its export's reading of its files (:func:`~precsearch.export.registry.as_run`); its peak
is precsearch's memory model (:func:`~precsearch.probe.memory.peak.predict_peak`) at the study's target model
with the framework's rules where the model has them (:mod:`precsearch.probe.memory.frameworks`): Megatron-Core's
standard optimizer (persistent gradient buffer, FP32 main-gradient copy) and TE ``FusedAdam``'s FP32 copies of
FP8 moments; torchao's ``Float8Linear`` and torchtitan's compiled blocks; Accelerate's torchao setup with its
regional compilation; Hugging Face's and torchtitan's FP32 cross-entropy. The saving is against BF16 run alike
(the study's ``objectives.baseline_memory``, the same framework rules). The target's speed-up is
:mod:`precsearch.runtime.target_speed`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from precsearch.config.space import ModelSection, ProbeSection, stored_baseline_knobs
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


@dataclass(frozen=True)
class TargetSaving:
    """What a target's run of a policy holds against its BF16 run, predicted.

    Attributes:
        target: The target (``megatron``, ``torchtitan``, ``accelerate`` or ``precsearch``).
        n_layers: The blocks of the model it is for.
        peak_bytes: The peak of the target's run of the policy, as the target's export writes it.
        baseline_bytes: The peak of the target's BF16 run (``objectives.baseline_memory``).
        trial_parts: ``peak_bytes``'s memory components (:meth:`~precsearch.probe.memory.peak.MemoryBreakdown.components`).
        baseline_parts: ``baseline_bytes``'s components.
    """

    target: str
    n_layers: int
    peak_bytes: int
    baseline_bytes: int
    trial_parts: dict[str, int]
    baseline_parts: dict[str, int]

    @property
    def saved(self) -> float:
        """``1 - peak / BF16 peak``."""
        return 1.0 - self.peak_bytes / self.baseline_bytes


def target_saving(space: dict[str, Any], target: str, policy: Policy, n_layers: int | None = None) -> TargetSaving:
    """What ``target``'s run of ``policy`` saves at the stored ``space``'s target model, or at its width with
    ``n_layers`` blocks (the probe's depth, a bench's)."""
    cfg = ModelSection(**space["model"]).target()
    if n_layers is not None:
        cfg = cfg.with_overrides(n_layers=n_layers)
    probe = ProbeSection(**space["probe"])
    written = as_run(TARGETS[target], policy, cfg.n_layers)
    baseline = stored_baseline_knobs(space)
    how = target_run(target, policy, cfg.n_layers)

    def peak(precisions: dict, memory: MemoryKnobs, run: TargetRun) -> tuple[int, dict[str, int]]:
        fp8_moments = "fp8" in memory.moment_dtypes(probe.param_dtype) and run.framework == "megatron"
        b = predict_peak(cfg, precisions, seq_len=probe.seq_len, micro_batch=probe.micro_batch,
                         param_dtype=probe.param_dtype, memory=memory, grad_accum=probe.grad_accum,
                         fp8_linear=run.fp8_linear, fused_adam_fp8=fp8_moments, compiled_blocks=run.compiled)
        return framework_peak(run.framework, b, memory), b.components()

    bf16 = replace(how, compiled=how.compiled or target == "accelerate")  # its BF16 setup compiles its blocks
    trial, trial_parts = peak(written.precisions, written.memory, how)
    base, base_parts = peak({}, baseline, bf16)
    return TargetSaving(target, cfg.n_layers, trial, base, trial_parts, base_parts)


def target_memory_saved(space: dict[str, Any], target: str, policy: Policy, n_layers: int | None = None) -> float:
    """``1 - peak / BF16 peak`` of ``target``'s run of ``policy`` (:func:`target_saving`)."""
    return target_saving(space, target, policy, n_layers).saved


def study_target_saving(space: dict[str, Any], policy: Policy) -> TargetSaving | None:
    """What the stored ``space``'s framework target (``target: name``: megatron, torchtitan or accelerate) saves
    running ``policy``, on the model its ``objectives.memory_basis`` scores (the target model, or the probe's
    depth); None for a space without a framework target (precsearch's own probe is then the figure)."""
    name = (space.get("target") or {}).get("name")
    if name in (None, "precsearch"):
        return None
    basis = (space.get("objectives") or {}).get("memory_basis") or "target"
    section = ModelSection(**space["model"])
    return target_saving(space, name, policy, section.probe().n_layers if basis == "probe" else None)


__all__ = ["TargetRun", "TargetSaving", "study_target_saving", "target_memory_saved", "target_run",
           "target_saving"]
