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
With ``--use-precision-aware-optimizer`` (the memory knobs) the gradient buffer is as persistent, and who keeps
the master decides the step: under ``--fp8-recipe`` tensorwise or blockwise Megatron keeps whole FP32 main
parameters itself and copies every gradient to FP32 as above; with no FP8 or delayed scaling (or an FP16 master)
it hands the master to TE's ``FusedAdam`` (BF16 + 16-bit remainders) with the BF16 gradients as they are, and the
step adds nothing (``megatron/core/optimizer/optimizer_config.py``: ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``;
:func:`~precsearch.export.memory_knobs.megatron_written` gives the state). At the backward Megatron's loss holds
:data:`MEGATRON_LOGIT_BYTES` per logit where the probe's holds 6. Against the H200 runs this is within 0.5% of
FP8 current with an FP32 master and BF16 moments (30.38 GiB measured, 2026-12-07) and of two study trials with a
remainders master (23.96 and 24.48 GiB, 2026-12-06), where the probe's figure read 10-16% under.

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
from precsearch.policy.rules import FP32_MASTER_AND_MOMENTS, MemoryKnobs
from precsearch.probe.memory.peak import MemoryBreakdown

#: Bytes per logit ``F.cross_entropy(logits.float(), ...)`` holds at its backward (three FP32 tensors).
F_CROSS_ENTROPY_LOGIT_BYTES = 3 * 4

#: Megatron-Core's default optimizer state: BF16 parameters, FP32 main parameters, FP32 moments.
MEGATRON_STANDARD = FP32_MASTER_AND_MOMENTS

#: Bytes per logit Megatron's vocab-parallel cross-entropy holds at the backward's peak: its FP32 softmax,
#: the gradient made in place in it. Measured: every backward phase of the H200 runs (BF16 and FP8 with the
#: standard and the precision-aware optimizer) sits one BF16 logit tensor under the probe's count.
MEGATRON_LOGIT_BYTES = 4


def probe_peak(b: MemoryBreakdown, memory: MemoryKnobs) -> int:
    """The probe's own peak: the model as it stands."""
    return b.total


def megatron_peak(b: MemoryBreakdown, memory: MemoryKnobs) -> int:
    """Megatron-Core's peak for a run the model broke down as ``b``, its optimizer state ``memory`` as Megatron
    keeps it (see the module docstring)."""
    loss_saves = b.logits * (LOGIT_BYTES - MEGATRON_LOGIT_BYTES) // LOGIT_BYTES
    backward = b.backward_peak + b.grads - loss_saves  # the persistent main_grad buffer
    if memory.master != "fp32":  # FusedAdam keeps the master and steps the BF16 gradients where they are
        return max(backward, b.step_peak)
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
