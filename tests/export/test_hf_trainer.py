"""The Hugging Face Trainer set-up the Accelerate export writes for a policy with optimizer knobs, run for real.

``hf_trainer_fp8.py`` is executed with transformers' own ``Trainer`` on a tiny ``LlamaForCausalLM`` on CPU,
for two optimizer steps: precsearch's ``FP8StateAdamW`` steps there in eager PyTorch (its Triton kernels are
the CUDA path, tested on the GPU in tests/backends/test_gpu_fp8_state_adam.py). If this failed, the knobs
would not travel to a Trainer run: Trainer would build its own AdamW, or Accelerate would copy every state
through a state_dict round trip, or the layers would never train.
"""

from __future__ import annotations

import pytest
import torch

from precsearch.export.accelerate import POLICY_FILE, TRAINER_FILE
from precsearch.export.registry import render
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision

N = 2
KNOBS = MemoryKnobs(master_weights=True, moment_dtype="fp8_block", master_dtype="remainders")
POLICY = Policy(rules=(Rule("head", ("output_layer",), Precision.BF16),), default=Precision.FP8_CURRENT,
                warmup_steps=1, clip_grad=1.0, memory=KNOBS)


def _run_trainer(tmp_path, monkeypatch) -> dict:
    """Write the export to ``tmp_path`` and execute its Trainer file there; return the file's namespace."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    for name, text in render("accelerate", POLICY, N, {}).files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=N, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False))
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                                          learning_rate=1e-2, use_cpu=True, report_to=[], save_strategy="no",
                                          logging_strategy="no", disable_tqdm=True)
    namespace = {"model": model, "train_dataset": [{"input_ids": i, "labels": i} for i in ids],
                 "training_args": args, "before": {n: p.detach().float().clone() for n, p in model.named_parameters()}}
    exec(compile((tmp_path / TRAINER_FILE).read_text(), TRAINER_FILE, "exec"), namespace)
    return namespace


def test_the_trainer_file_trains_with_precsearchs_optimizer_and_its_fp8_states(tmp_path, monkeypatch):
    from precsearch.backends.emulated import EmulatedFP8Linear
    from precsearch.backends.fp8_state_adam import FP8StateAdamW

    fp8_on: list[bool] = []  # each FP8 layer forward's switch: off in the warm-up step, on after
    forward = EmulatedFP8Linear.forward
    monkeypatch.setattr(EmulatedFP8Linear, "forward", lambda self, x: (fp8_on.append(self.fp8_enabled),
                                                                       forward(self, x))[1])
    ns = _run_trainer(tmp_path, monkeypatch)
    trainer, optimizer, model = ns["trainer"], ns["optimizer"], ns["model"]
    assert trainer.state.global_step == 2
    converted = {n for n, m in model.named_modules() if isinstance(m, EmulatedFP8Linear)}
    assert len(converted) == 7 * N and "lm_head" not in converted  # every block projection; the head BF16
    assert fp8_on == [False] * 7 * N + [True] * 7 * N  # policy.autocast at Trainer's global_step
    assert isinstance(optimizer, FP8StateAdamW) and trainer.optimizer.optimizer is optimizer  # not rebuilt
    assert trainer.accelerator.device_placement is False  # no state_dict round trip of the states
    params = dict(model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}  # the master keeps the FP32 bits
    for name, p in params.items():
        state = optimizer.state[p]
        assert state["step"] == 2, name
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float8_e4m3fn, name
        assert state["param_remainders"].dtype == torch.int16, name
        assert not torch.equal(p.detach().float(), ns["before"][name]), f"{name} did not train"


def test_the_trainer_file_is_written_only_with_optimizer_knobs():
    """Without optimizer knobs the Trainer's own AdamW is the policy's: nothing to ship."""
    assert TRAINER_FILE not in render("accelerate", Policy(default=Precision.FP8_CURRENT), N, {}).files
    only_attention = Policy(default=Precision.FP8_CURRENT, memory=MemoryKnobs(fp8_attention="dpa"))
    assert TRAINER_FILE not in render("accelerate", only_attention, N, {}).files
    files = render("accelerate", POLICY, N, {}).files
    assert POLICY_FILE in files and "optimizers=(optimizer, None)" in files[TRAINER_FILE]
