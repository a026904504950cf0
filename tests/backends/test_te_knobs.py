"""Which memory knobs each backend accepts, decided without a GPU (the checks a space file gets).

What would be wrong if these failed: a knob the CPU backends cannot apply (FP8 moments need TE
FusedAdam) would be silently ignored, or FP8 attention would be offered where TE finds no fused
attention (head_dim 64 on Hopper, current scaling below sm_100) and fail inside a trial.
"""

from __future__ import annotations

import torch

from precsearch.backends import get_backend
from precsearch.backends.te_knobs import fp8_attention_model_problem, fp8_attention_precisions, te_memory_knob_problem
from precsearch.policy import MemoryKnobs
from precsearch.precision import Precision

CPU = torch.device("cpu")


def test_the_cpu_backend_refuses_every_non_default_knob_and_names_it():
    backend = get_backend("emulated", CPU)
    assert backend.memory_knob_problem(MemoryKnobs(), CPU) is None
    for knobs, name in ((MemoryKnobs(exp_avg_dtype="fp8"), "exp_avg_dtype=fp8"),
                        (MemoryKnobs(master_weights=True, master_dtype="fp16"), "master_dtype=fp16"),
                        (MemoryKnobs(fp8_attention="dpa"), "fp8_attention=dpa")):
        problem = backend.memory_knob_problem(knobs, CPU)
        assert problem is not None and name in problem and "backend 'te'" in problem  # 'te' alone matched any word


def test_te_needs_a_gpu_for_any_knob_and_names_it():
    problem = te_memory_knob_problem(MemoryKnobs(moment_dtype="fp8"), CPU)
    assert "moment_dtype=fp8" in problem and "CUDA" in problem


def test_fp8_attention_runs_only_where_te_fuses_it():
    assert fp8_attention_precisions((8, 9)) == ()
    assert fp8_attention_precisions((9, 0)) == (Precision.FP8_DELAYED,)  # current scaling: sm_100 and newer
    assert Precision.FP8_CURRENT in fp8_attention_precisions((10, 0))
    assert "head_dim 128" in fp8_attention_model_problem(64, (9, 0))
    assert fp8_attention_model_problem(128, (9, 0)) is None
    assert fp8_attention_model_problem(64, (10, 0)) is None


def test_master_weights_on_fp32_parameters_warn_that_they_are_a_second_copy(monkeypatch):
    """Accelerate's knob path on a Hugging Face model (FP32 parameters) peaked 27% over BF16 on the H200."""
    import warnings

    import torch

    import precsearch.backends.te as te_backend
    from precsearch.policy import MemoryKnobs

    built = []
    monkeypatch.setattr(te_backend, "build_optimizer", lambda params, *a, **k: built.append(k) or object())
    backend = te_backend.TEBackend()
    for dtype, knobs, warns in ((torch.float32, MemoryKnobs(master_weights=True), True),
                                (torch.bfloat16, MemoryKnobs(master_weights=True), False),
                                (torch.float32, MemoryKnobs(moment_dtype="bf16"), False)):
        model = torch.nn.Linear(4, 4).to(dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            backend.build_optimizer(model, knobs, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
        assert any("second FP32 copy" in str(w.message) for w in caught) == warns, (dtype, knobs)
    assert len(built) == 3


def test_fp8_block_moments_refuse_what_only_fused_adam_steps():
    for knobs, named in ((MemoryKnobs(moment_dtype="fp8_block", fp8_weights=True), "fp8_weights=True"),
                         (MemoryKnobs(master_weights=True, master_dtype="fp16", exp_avg_sq_dtype="fp8_block"),
                          "master_dtype=fp16")):
        problem = te_memory_knob_problem(knobs, torch.device("cpu"))
        assert problem.startswith(f"fp8_block moments with {named}: only precsearch's FP8StateAdamW")
    allowed = te_memory_knob_problem(MemoryKnobs(moment_dtype="fp8_block", master_weights=True), torch.device("cpu"))
    assert allowed.endswith("need a CUDA GPU (device is cpu)")  # refused for the device only
