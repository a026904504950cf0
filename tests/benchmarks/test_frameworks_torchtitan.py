"""The torchtitan export read and trained by torchtitan 0.2.2 itself, on the CPU (torchao's emulated FP8, eager).

:mod:`frameworks_torchtitan` builds what torchtitan's trainer builds from the exported TOML: its config parser
(which refuses a key it does not know), its Llama 3, its converters (whose substring filter decides which
layers run FP8), its AdamW, loss and clipping. The GPU bench (``benchmarks/gpu/gpu_torchtitan.sh``) runs the same
code compiled, at the 8B width.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchao")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import frameworks_plan as plan  # noqa: E402
import frameworks_runs as runs  # noqa: E402
import frameworks_torchtitan as titan  # noqa: E402
from _saved import saved_storage_bytes  # noqa: E402

if not titan.importable():  # in the test extras: pip install -e ".[test]"
    pytest.skip("torchtitan is not installed", allow_module_level=True)

LAYERS = 4
#: A small Llama 3 every dimension of which torchao converts (multiples of 16).
SHAPE = plan.Shape(layers=LAYERS, dim=256, ffn=768, heads=16, kv_heads=4, vocab=512, seq=64, steps=3,
                   warmup_steps=1)
TRAINABLE = [p for p in plan.POLICIES if p != "mxfp8"]


def _build(name: str, tmp_path: Path, emulate: bool = True):
    policy = plan.policy_named(name, LAYERS)
    files, warnings = plan.export_files("torchtitan", policy, LAYERS, tmp_path)
    return policy, warnings, titan.build(files[plan.TITAN_FILE], SHAPE, "cpu", lr=1e-3, weight_decay=0.1,
                                         compile_model=False, emulate=emulate)


@pytest.mark.parametrize("name", TRAINABLE)
def test_torchtitan_runs_each_layer_as_the_policy_or_its_warning_says_and_trains_every_weight(name, tmp_path):
    torch = pytest.importorskip("torch")
    policy, warnings, run = _build(name, tmp_path)
    # every layer as the policy gives it, except what the export warned torchtitan cannot run (delayed scaling)
    as_run = plan.as_torchtitan_runs(policy, LAYERS)
    check = plan.check_modules(titan.observed(run.model), titan.expected(as_run, LAYERS))
    assert check["ok"] == check["modules"] == 7 * LAYERS + 1, check
    differs = plan.runs_differently_in_torchtitan(name, LAYERS)
    assert differs == any("kept BF16" in w for w in warnings), warnings
    if differs:
        assert plan.check_modules(titan.observed(run.model), titan.expected(policy, LAYERS))["n_mismatches"] > 0
    assert run.max_norm == policy.clip_grad
    before = runs.fingerprints(run.model)
    ids = torch.randint(0, SHAPE.vocab, (SHAPE.mb, SHAPE.seq + 1), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        run.optimizer.zero_grad(set_to_none=True)
        loss = run.forward(ids[:, :-1], ids[:, 1:])
        loss.backward()
        norm = run.clip()
        run.optimizer.step()
        assert math.isfinite(loss.item()) and math.isfinite(float(norm))
    trained = runs.trained(before, run.model, run.optimizer)
    assert trained["ok"] and trained["moved"] == trained["matrices"], trained


def test_torchtitan_refuses_the_mxfp8_export_below_blackwell_as_the_bench_does(tmp_path):
    """The MX section parses (an unknown key would not); torchtitan's converter then refuses this machine,
    and :func:`frameworks_plan.not_runnable` refuses an H200 before any run."""
    with pytest.raises(AssertionError, match="SM100"):
        _build("mxfp8", tmp_path, emulate=False)
    assert "needs compute capability 10.0" in plan.not_runnable(plan.POLICIES["mxfp8"], LAYERS, (9, 0))


def test_torchtitan_refuses_a_key_it_does_not_know(tmp_path):
    """What makes the tests above a check of the exported key names: the parser rejects a misspelt one."""
    toml = tmp_path / "bad.toml"
    toml.write_text('[quantize.linear.float8]\nrecipe_nam = "tensorwise"\n')
    with pytest.raises(ValueError, match="recipe_nam"):
        titan.build(toml, SHAPE, "cpu", lr=1e-3, weight_decay=0.1, compile_model=False, emulate=True)


def test_the_job_line_carries_the_bench_settings_and_compile_as_the_export_says(tmp_path):
    args = titan.job_args(tmp_path / "x.toml", SHAPE, lr=1e-4, weight_decay=0.1, compile_model=True)
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--job.config_file"] == str(tmp_path / "x.toml")
    assert pairs["--activation_checkpoint.mode"] == "none" and pairs["--training.seq_len"] == str(SHAPE.seq)
    assert args[-3:] == ["--compile.enable", "--compile.components", "model"]


def test_compiled_blocks_keep_their_names_and_train(tmp_path):
    """The GPU bench compiles each block (torchtitan's ``apply_compile``, ``fullgraph=True``), which puts an
    ``_orig_mod`` level into every name: the module check and the training check must see through it. BF16
    only: torchtitan refuses emulated FP8 under compile, and a CPU has no FP8 GEMM."""
    torch = pytest.importorskip("torch")
    policy = plan.policy_named("bf16", 2)
    files, _ = plan.export_files("torchtitan", policy, 2, tmp_path)
    shape = plan.Shape(**{**plan.shape_dict(SHAPE), "layers": 2})
    torch._dynamo.reset()  # earlier tests' compiles count towards the recompile limit (then blocks run eager)
    run = titan.build(files[plan.TITAN_FILE], shape, "cpu", lr=1e-3, weight_decay=0.1, compile_model=True)
    assert any("._orig_mod." in n for n, _ in run.model.named_modules())
    check = plan.check_modules(titan.observed(run.model), titan.expected(policy, 2))
    assert check["ok"] == check["modules"] == 15, check
    before = runs.fingerprints(run.model)
    ids = torch.randint(0, shape.vocab, (1, shape.seq + 1), generator=torch.Generator().manual_seed(0))
    run.optimizer.zero_grad(set_to_none=True)
    run.forward(ids[:, :-1], ids[:, 1:]).backward()
    run.clip()
    run.optimizer.step()
    assert runs.trained(before, run.model, run.optimizer)["ok"]


def test_a_compiled_torchtitan_block_saves_what_the_memory_models_compiled_rule_counts(tmp_path):
    """The compiled rule (``precsearch/probe/memory/compiled.py``) was read off Hugging Face's blocks on the H200.
    torchtitan's own compiled BF16 blocks, here on the CPU, save the same tensors: 3 ``ffn_dim``-wide and 3
    ``dim``-wide BF16 inputs and one FP32 residual a block, every weight's BF16 cast. (FP8 cannot compile on a
    CPU: torchtitan refuses emulation under compile.)"""
    torch = pytest.importorskip("torch")
    from precsearch.probe.memory.compiled import compiled_activation_bytes

    layers = 2
    shape = plan.Shape(**{**plan.shape_dict(SHAPE), "layers": layers})
    files, _ = plan.export_files("torchtitan", plan.policy_named("bf16", layers), layers, tmp_path)
    torch._dynamo.reset()  # earlier tests' compiles count towards the recompile limit (then blocks run eager)
    run = titan.build(files[plan.TITAN_FILE], shape, "cpu", lr=1e-3, weight_decay=0.1, compile_model=True)
    ids = torch.randint(0, shape.vocab, (1, shape.seq + 1), generator=torch.Generator().manual_seed(0))
    run.forward(ids[:, :-1], ids[:, 1:]).backward()  # compiled here, so that the measured step only runs
    _, saved = saved_storage_bytes(lambda: run.forward(ids[:, :-1], ids[:, 1:]))
    cfg = shape.model_config()
    inputs, other = compiled_activation_bytes(cfg, {}, seq_len=shape.seq, micro_batch=shape.mb)
    weight_casts = 2 * sum(p.numel() for n, p in run.model.named_parameters()  # every matrix but the embedding
                           if p.dim() == 2 and "tok_embeddings" not in n)
    fp32_logits = 4 * shape.seq * cfg.vocab_size  # the loss's, outside the rule
    predicted = inputs + other + weight_casts + fp32_logits
    assert abs(saved / predicted - 1) < 0.005, (saved, predicted)
