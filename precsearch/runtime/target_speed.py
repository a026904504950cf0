"""The speed-up a study's target runs a trial's policy at, predicted from the probe's steps.

For ``target: megatron`` the probe's step is taken with its optimizer step swapped for Megatron's (measured per
optimizer state and card, :mod:`precsearch.probe.framework_step`), for the trial as Megatron's export runs it and
for Megatron's standard BF16 run (FP32 main parameters and moments, ``objectives.baseline_memory``; gradients
clipped at 1.0, Megatron's default). Accelerate's snippet steps precsearch's own optimizer
(``policy.build_optimizer``), so the probe's speed-up is already its figure; a torchtitan study's probe runs as
torchtitan does (torchao's FP8 Linear, each block compiled on a GPU, FP32 parameters and AdamW states), so its
speed-up is the probe's too. Where nothing is predicted, :attr:`FrameworkSpeed.why_not` says why and
the study keeps the probe's speed-up.
"""

from __future__ import annotations

from typing import Any

from precsearch.config.space import ModelSection, ProbeSection, stored_baseline_knobs
from precsearch.export.registry import TARGETS, as_run
from precsearch.policy.rules import MemoryKnobs, Policy
from precsearch.probe.framework_step import FrameworkSpeed, StepRun, framework_speed
from precsearch.probe.result import ProbeResult

#: Why a framework target's speed-up is the probe's, where it is not predicted by the optimizer swap.
NOT_SWAPPED = {
    "accelerate": "Accelerate's snippet steps precsearch's own optimizer, as the probe does",
    "torchtitan": "the probe runs as torchtitan does (torchao's FP8 Linear, each block compiled)",
}

#: Megatron's standard BF16 run clips its gradients (``--clip-grad`` defaults to 1.0).
BASELINE_CLIPPED = True


def study_target_speed(space: dict[str, Any], policy: Policy, result: ProbeResult, reference: ProbeResult
                       ) -> FrameworkSpeed | None:
    """The stored ``space``'s framework target's speed-up of ``policy`` (probed as ``result``, its BF16 reference
    ``reference``) over the target's standard BF16 run; None for a space without a framework target."""
    name = (space.get("target") or {}).get("name")
    if name in (None, "precsearch"):
        return None
    if name == "torchtitan" and not (space.get("backend") == "torchao" and result.card):
        ran = f"backend {space.get('backend')}" + ("" if result.card else " on a CPU")
        return FrameworkSpeed(name, why_not=f"the probe ran {ran}, not torchao's FP8 Linear in compiled blocks as "
                                            "torchtitan does (backend torchao on a GPU): no prediction")
    if name in NOT_SWAPPED:
        return FrameworkSpeed(name, why_not=NOT_SWAPPED[name])
    if result.card != reference.card:  # a resumed study's cached reference, from another machine
        return FrameworkSpeed(name, why_not=f"the trial ran on {result.card or 'a CPU'}, its BF16 reference on "
                                            f"{reference.card or 'a CPU or a card not recorded'}")
    probe = ProbeSection(**space["probe"])
    cfg = ModelSection(**space["model"]).probe()
    baseline = stored_baseline_knobs(space)
    tokens = probe.seq_len * probe.micro_batch * probe.grad_accum
    written = as_run(TARGETS[name], policy, cfg.n_layers).memory

    def run(r: ProbeResult, memory: MemoryKnobs, clipped: bool) -> StepRun:
        step = tokens / r.tokens_per_s if r.tokens_per_s else float("nan")
        return StepRun(step, r.optimizer_step_s, memory, clipped)

    return framework_speed(name, run(result, written, policy.clip_grad is not None),
                           run(reference, baseline, BASELINE_CLIPPED), cfg.num_params(), result.card)


__all__ = ["BASELINE_CLIPPED", "NOT_SWAPPED", "study_target_speed"]
