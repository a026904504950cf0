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
``2026-12-01_h200_bench_frameworks.json@1d486ad``) this puts the prediction within 0.3% of every
standard-optimizer row, where the probe's peak read 12.7-12.9% under (``tests/benchmarks/test_bench_frameworks.py``).
With ``--use-precision-aware-optimizer`` (the memory knobs) Megatron hands its gradients to TE's ``FusedAdam``
without the FP32 copy and its distributed optimizer holds less than the probe at the backward; that case is
not modelled here and keeps the probe's figure (+0.9% over the one recorded run).

Hugging Face's ``LlamaForCausalLM`` loss and torchtitan's both call ``F.cross_entropy`` on the logits cast to
FP32, which holds three FP32 logit-sized tensors at the log-softmax backward (the saved output, the incoming
gradient and the input's gradient: :data:`F_CROSS_ENTROPY_LOGIT_BYTES`) where the probe's loss holds
:data:`~precsearch.backends.cross_entropy.LOGIT_BYTES`. With that, the BF16 rows of the 4-block torchao and
Accelerate runs (H200, 2026-12-03) are predicted 0.8% under their peaks, where the probe's loss read 10.5%
under. Their torchao FP8 rows are counted with torchao's own FP8 Linear (``fp8_linear="torchao"`` of
:func:`~precsearch.probe.memory.peak.predict_peak`, set by the bench): eager, memory saved against BF16 as
measured to 0.1 point. torchtitan's per-block ``torch.compile`` saves 0.4-2.3 points more than eager autograd
holds; its rows are counted with the compiled rule (``compiled_blocks`` of
:func:`~precsearch.probe.memory.peak.predict_peak`, :mod:`precsearch.probe.memory.compiled`).
"""

from __future__ import annotations

from precsearch.backends.cross_entropy import LOGIT_BYTES
from precsearch.policy.rules import MemoryKnobs
from precsearch.probe.memory.peak import MemoryBreakdown

#: Bytes per logit ``F.cross_entropy(logits.float(), ...)`` holds at its backward (three FP32 tensors).
F_CROSS_ENTROPY_LOGIT_BYTES = 3 * 4

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


def fp32_cross_entropy_peak(b: MemoryBreakdown, memory: MemoryKnobs) -> int:
    """The peak of a run whose loss is ``F.cross_entropy`` on FP32 logits (Hugging Face, torchtitan)."""
    backward = b.backward_peak + b.logits * (F_CROSS_ENTROPY_LOGIT_BYTES - LOGIT_BYTES) // LOGIT_BYTES
    return max(backward, b.step_peak)


#: Framework name -> its peak from the probe's memory breakdown and the run's optimizer state.
FRAMEWORK_PEAKS = {"probe": probe_peak, "megatron": megatron_peak, "torchtitan": fp32_cross_entropy_peak,
                   "accelerate": fp32_cross_entropy_peak}


def framework_peak(framework: str, b: MemoryBreakdown, memory: MemoryKnobs) -> int:
    """The predicted peak of ``framework``'s run (bytes); frameworks without a rule get the probe's."""
    return FRAMEWORK_PEAKS.get(framework, probe_peak)(b, memory)
