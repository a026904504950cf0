"""Hugging Face Trainer set-up, written beside the Accelerate snippet for a policy with optimizer knobs.

``Trainer`` takes a user optimizer (``optimizers=(optimizer, scheduler)``), so precsearch's optimizer, and with
it the memory knobs, travels: ``hf_trainer_fp8.py`` builds it with ``policy.build_optimizer`` (precsearch's
``FP8StateAdamW`` for FP8 moments, on any device; TE ``FusedAdam`` for the other knobs, on a GPU) after applying
the policy with precsearch's Python API. Checked against transformers 5.25 (``trainer.py``) and accelerate 1.16:

* ``Trainer.create_optimizer`` keeps an optimizer given through ``optimizers``; a ``None`` scheduler is built
  on it by ``create_scheduler`` from ``TrainingArguments``. Trainer refuses ``optimizers`` under its FSDP.
* ``Trainer`` prepares the optimizer with ``accelerator.prepare(model, optimizer)`` and no
  ``device_placement``, so the Accelerator's own (True) applies, and ``AcceleratedOptimizer.__init__``
  round-trips the optimizer's ``state_dict`` to the device: a copy of every state (the 16 GiB spike the
  Accelerate snippet avoids with ``device_placement=False``). The snippet's ``Trainer`` subclass turns the
  Accelerator's ``device_placement`` off once ``create_accelerator_and_postprocess`` made it; Trainer still
  moves the model (``place_model_on_device``) and each batch (``_prepare_input``) to ``args.device`` itself.
* Each forward runs under ``policy.autocast(model, self.state.global_step)`` (``compute_loss``): FP8 off for
  the warm-up steps; the backward ``training_step`` runs after it follows the same choice.
"""

from __future__ import annotations

from typing import Any

from precsearch.export.format_output import header, warning_lines
from precsearch.policy.rules import Policy

FILE = "hf_trainer_fp8.py"

_TRAINER = '''\
import torch
from transformers import Trainer

from precsearch import load_policy

policy = load_policy("{policy_file}")  # written next to this file


class PolicyTrainer(Trainer):
    """Trainer with the policy's FP8 per step, and precsearch's optimizer kept where it was built."""

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        # the optimizer's states are made on the device already: Accelerate's device placement would copy them
        # all (a state_dict round trip); Trainer still moves the model and each batch to args.device itself
        self.accelerator.device_placement = False

    def compute_loss(self, model, inputs, *args, **kwargs):
        with policy.autocast(model, self.state.global_step):  # BF16 for the warm-up steps, FP8 after
            return super().compute_loss(model, inputs, *args, **kwargs)


{place}
# before building the optimizer; backend="te" runs it on Transformer Engine where precsearch supports that,
# the default "emulated" runs anywhere (slower than BF16)
model = policy.apply(model)
training_args.max_grad_norm = {clip}  # the policy's clip_grad (0: none)
# the states are made beside the parameters: build it with the model on its device
optimizer = policy.build_optimizer(model, lr=training_args.learning_rate, weight_decay=training_args.weight_decay,
                                   betas=(training_args.adam_beta1, training_args.adam_beta2))
trainer = PolicyTrainer(model=model, args=training_args, train_dataset=train_dataset,
                        optimizers=(optimizer, None))  # None: Trainer builds its scheduler on this optimizer
trainer.train()
'''


def trainer_file(policy: Policy, n_layers: int, provenance: dict[str, Any], policy_file: str,
                 warnings: list[str]) -> str:
    """``hf_trainer_fp8.py``: the Trainer set-up for ``policy`` (read from ``policy_file`` beside it)."""
    lines = header(provenance, f"Hugging Face Trainer set-up for a {n_layers}-layer Llama 3 (LlamaForCausalLM "
                               "names), with precsearch's optimizer for the policy's memory settings")
    lines += warning_lines(warnings)
    lines.append("# `model`, `train_dataset` and `training_args` (TrainingArguments) are yours.")
    if policy.memory.master != "none":
        place = ("# BF16 parameters: the optimizer keeps the FP32 master (on FP32 parameters it would be a "
                 "second FP32 copy)\nmodel = model.to(device=training_args.device, dtype=torch.bfloat16)")
    else:
        place = "model = model.to(training_args.device)"
    clip = policy.clip_grad if policy.clip_grad is not None else 0.0
    lines.append(_TRAINER.format(policy_file=policy_file, place=place, clip=repr(float(clip))))
    return "\n".join(lines).rstrip("\n") + "\n"


__all__ = ["FILE", "trainer_file"]
