"""An exported policy's peak in a training framework, from the probe's memory model.

:func:`~precsearch.probe.memory.peak.predict_peak` counts the probe's own step: gradients freed before each
backward (``zero_grad(set_to_none=True)``) and a fused AdamW that allocates nothing. Megatron-Core's
standard optimizer (BF16 parameters with FP32 main parameters and moments: ``Float16OptimizerWithFloat16Params``,
what the export gives a policy without memory knobs) differs at both moments that can hold the peak:

* **backward**: its ``DistributedDataParallel`` keeps every gradient in one persistent buffer (``main_grad``,
  in the parameters' dtype), so the gradients are alive when the backward starts;
* **step**: it copies every main gradient to FP32 before Adam runs (one FP32 tensor per parameter, as large
  as the FP32 main parameters), while Transformer Engine's cached FP8 weight copies stay alive.

Against the recorded 4-block Megatron-Core runs at the 8B width (H200, 2026-12-01,
``scripts/results/2026-12-01_h200_bench_frameworks.json``) this puts the prediction within 0.3% of every
standard-optimizer row, where the probe's peak read 12.7-12.9% under (``tests/probe/memory/test_frameworks_memory.py``).
With ``--use-precision-aware-optimizer`` (the memory knobs) Megatron hands its gradients to TE's ``FusedAdam``
without the FP32 copy and its distributed optimizer holds less than the probe at the backward; that case is
not modelled here and keeps the probe's figure (+0.9% over the one recorded run).
"""

from __future__ import annotations

from precsearch.policy.rules import MemoryKnobs
from precsearch.probe.memory.peak import MemoryBreakdown

#: Megatron-Core's default optimizer state: BF16 parameters, FP32 main parameters, FP32 moments.
MEGATRON_STANDARD = MemoryKnobs(master_weights=True, moment_dtype="fp32")


def probe_peak(b: MemoryBreakdown, memory: MemoryKnobs) -> int:
    """The probe's own peak: the model as it stands."""
    return b.total


def megatron_peak(b: MemoryBreakdown, memory: MemoryKnobs) -> int:
    """Megatron-Core's peak for a run the model broke down as ``b`` (see the module docstring)."""
    if memory != MEGATRON_STANDARD:  # the precision-aware optimizer: not modelled, the probe's figure
        return b.total
    backward = b.backward_peak + b.grads  # the persistent main_grad buffer
    fp32_main_grads = b.master  # an FP32 copy of every parameter, as large as the FP32 main parameters
    step = b.step_peak + fp32_main_grads + b.weight_copies
    return max(backward, step)


#: Framework name -> its peak from the probe's memory breakdown and the run's optimizer state.
FRAMEWORK_PEAKS = {"probe": probe_peak, "megatron": megatron_peak}


def framework_peak(framework: str, b: MemoryBreakdown, memory: MemoryKnobs) -> int:
    """The predicted peak of ``framework``'s run (bytes); frameworks without a rule get the probe's."""
    return FRAMEWORK_PEAKS.get(framework, probe_peak)(b, memory)
