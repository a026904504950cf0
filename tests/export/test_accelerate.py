"""Accelerate export: which path fits, and the snippets run against stand-ins for accelerate/torchao.

Reference (huggingface/accelerate, src/accelerate/): ``utils/dataclasses.py`` (``AORecipeKwargs(config,
module_filter_func)``, ``TERecipeKwargs(fp8_format, amax_history_len, amax_compute_algo, margin,
use_mxfp8_block_scaling)``, ``KwargsHandler.to_kwargs`` keeps only values that differ from Accelerate's
defaults), ``utils/transformer_engine.py::apply_fp8_autowrap`` (one ``fp8_autocast`` around
``model.forward`` with ``DelayedScaling(**kwargs)`` or ``MXFP8BlockScaling(**kwargs)``), ``utils/ao.py``
(``module_filter_func(module, fqn)``). TE defaults from NVIDIA/TransformerEngine
``transformer_engine/common/recipe/__init__.py``. Most snippets run against recording stand-ins; the torchao
path also runs with the real accelerate and torchao (test extras), on CPU, through one training step.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from precsearch.export.accelerate import FILE, POLICY_FILE, choose_path
from precsearch.export.registry import render
from precsearch.export.format_output import layer_table
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.model.llama3 import ModelConfig

P = Precision
N = 4
CFG = ModelConfig(vocab_size=256, dim=64, n_layers=N, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
EDGES = Rule("edges", ("*",), P.BF16, first=1, last=1)


def _hf_llama() -> torch.nn.Module:
    """A tiny Hugging Face ``LlamaForCausalLM``: what an Accelerate user trains (HF module names)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=CFG.vocab_size, hidden_size=CFG.dim, intermediate_size=CFG.ffn_dim, num_hidden_layers=N,
        num_attention_heads=CFG.n_heads, num_key_value_heads=CFG.n_kv_heads, max_position_embeddings=64,
        tie_word_embeddings=False))

ACCELERATE_DEFAULTS = {"fp8_format": "HYBRID", "amax_history_len": 1024, "amax_compute_algo": "most_recent",
                       "margin": 0, "use_mxfp8_block_scaling": False}
TE_DEFAULTS = {"delayed": {"fp8_format": "HYBRID", "amax_history_len": 1024, "amax_compute_algo": "max", "margin": 0},
               "mxfp8": {"fp8_format": "E4M3", "margin": 0}}


#: What the bf16 and torchao setups ask Accelerate for: each decoder block compiled.
COMPILE_BLOCKS = {"backend": "inductor", "use_regional_compilation": True}


class _Recorder:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class _Accelerator(_Recorder):
    device = torch.device("cpu")

    def prepare(self, *objs, device_placement=None):
        self.device_placement = device_placement
        self.prepared = objs
        return objs

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def _run(code: str, monkeypatch, **env) -> dict:
    """Execute a snippet with stand-in accelerate / torchao modules; return its namespace."""
    accelerate = types.ModuleType("accelerate")
    accelerate.Accelerator = _Accelerator
    utils = types.ModuleType("accelerate.utils")
    utils.AORecipeKwargs = type("AORecipeKwargs", (_Recorder,), {})
    utils.TERecipeKwargs = type("TERecipeKwargs", (_Recorder,), {})
    utils.TorchDynamoPlugin = type("TorchDynamoPlugin", (_Recorder,), {})
    float8 = types.ModuleType("torchao.float8")
    float8.Float8LinearConfig = type("Float8LinearConfig", (_Recorder,), {})
    float8.CastConfig = type("CastConfig", (_Recorder,), {})
    for name, mod in {"accelerate": accelerate, "accelerate.utils": utils, "torchao": types.ModuleType("torchao"),
                      "torchao.float8": float8}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    namespace = {"model": None, "optimizer": None, "dataloader": [], **env}
    exec(compile(code, FILE, "exec"), namespace)
    return namespace


def _te_recipe(te_kwargs: dict, kind: str) -> dict:
    """What TE receives: Accelerate passes only non-default values (to_kwargs), TE fills in its own defaults."""
    passed = {k: v for k, v in te_kwargs.items() if ACCELERATE_DEFAULTS[k] != v and k != "use_mxfp8_block_scaling"}
    return TE_DEFAULTS[kind] | passed


@pytest.mark.parametrize(("policy", "path"), [
    (Policy(clip_grad=1.0), "bf16"),
    (Policy(default=P.FP8_DELAYED, recipe=LayerRecipe(amax_compute_algo="max")), "te"),
    (Policy(default=P.FP8_DELAYED, recipe=LayerRecipe(amax_compute_algo="most_recent")), "precsearch"),
    (Policy(default=P.MXFP8, recipe=LayerRecipe(fp8_format="e4m3")), "te"),
    (Policy(default=P.MXFP8), "precsearch"),  # hybrid MXFP8 cannot reach TE
    (Policy(default=P.FP8_CURRENT), "ao"),
    (Policy(rules=(EDGES, Rule("attn", ("*.self_attn.*",), P.FP8_CURRENT))), "ao"),
    (Policy(rules=(EDGES, Rule("attn", ("*.self_attn.*",), P.FP8_DELAYED))), "precsearch"),
    (Policy(rules=(Rule("attn", ("*.self_attn.*",), P.FP8_CURRENT),), default=P.FP8_BLOCK), "precsearch"),
])
def test_choose_path(policy, path):
    assert choose_path(policy, N)[0] == path


def test_uniform_delayed_goes_through_te_with_the_policy_recipe(monkeypatch):
    policy = Policy(default=P.FP8_DELAYED, recipe=LayerRecipe(amax_history_len=16, amax_compute_algo="max", margin=2),
                    clip_grad=1.0)
    rendered = render("accelerate", policy, N, {})
    assert list(rendered.files) == [FILE] and rendered.warnings == []
    ns = _run(rendered.files[FILE], monkeypatch)
    assert ns["accelerator"].kwargs == {"mixed_precision": "fp8", "kwargs_handlers": [ns["fp8_kwargs"]]}
    assert _te_recipe(ns["fp8_kwargs"].kwargs, "delayed") == {
        "fp8_format": "HYBRID", "amax_history_len": 16, "amax_compute_algo": "max", "margin": 2}


def test_uniform_mxfp8_goes_through_te(monkeypatch):
    rendered = render("accelerate", Policy(default=P.MXFP8, recipe=LayerRecipe(fp8_format="e4m3")), N, {})
    kwargs = _run(rendered.files[FILE], monkeypatch)["fp8_kwargs"].kwargs
    assert kwargs["use_mxfp8_block_scaling"] is True and "amax_history_len" not in kwargs
    assert _te_recipe(kwargs, "mxfp8") == {"fp8_format": "E4M3", "margin": 0}


@pytest.mark.parametrize("fp8_format", ["hybrid", "e4m3"])
def test_per_layer_tensorwise_goes_through_torchao_with_an_exact_filter(monkeypatch, fp8_format):
    model = _hf_llama()  # before the stand-in accelerate module is installed: transformers looks for it
    policy = Policy(rules=(EDGES, Rule("o", ("*.o_proj",), P.BF16, indices=(2,)),
                           Rule("rest", ("model.*",), P.FP8_CURRENT)),
                    recipe=LayerRecipe(fp8_format=fp8_format), warmup_steps=4, clip_grad=1.0)
    rendered = render("accelerate", policy, N, {})
    assert any("no FP8 warm-up" in w for w in rendered.warnings)
    ns = _run(rendered.files[FILE], monkeypatch)
    ao = ns["fp8_kwargs"].kwargs
    assert set(ao) == {"config", "module_filter_func"}
    assert ns["accelerator"].kwargs == {"mixed_precision": "fp8", "kwargs_handlers": [ns["fp8_kwargs"]],
                                        "dynamo_plugin": ns["compile_blocks"]}
    assert ns["compile_blocks"].kwargs == COMPILE_BLOCKS
    config = ao["config"].kwargs
    assert config["pad_inner_dim"] is True
    if fp8_format == "e4m3":
        assert config["cast_config_grad_output"].kwargs == {"target_dtype": torch.float8_e4m3fn}
    else:
        assert "cast_config_grad_output" not in config
    table = layer_table(policy, N)
    chosen = {name for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and ao["module_filter_func"](m, name)}
    assert chosen == {n for n, p in table.items() if p is P.FP8_CURRENT}
    assert "model.layers.2.self_attn.o_proj" not in chosen and "model.layers.2.self_attn.k_proj" in chosen
    assert not ao["module_filter_func"](torch.nn.Linear(64, 24), "model.layers.1.self_attn.q_proj")  # 24 % 16


def test_mixed_recipes_fall_back_to_the_exact_python_api(monkeypatch, tmp_path):
    policy = Policy(rules=(EDGES, Rule("attn", ("*.self_attn.*",), P.FP8_DELAYED),
                           Rule("mlp", ("*.mlp.*",), P.FP8_CURRENT)),
                    recipe=LayerRecipe(amax_history_len=8), warmup_steps=1, clip_grad=1.0)
    rendered = render("accelerate", policy, N, {"trial": 5})
    assert sorted(rendered.files) == [FILE, POLICY_FILE]
    assert any("one fp8_autocast with one recipe" in w for w in rendered.warnings)
    assert any("fp8_delayed layers have no Accelerate setting" in w for w in rendered.warnings)
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)

    model = _hf_llama()
    batches = [{"input_ids": torch.randint(0, 256, (2, 16)), "labels": torch.randint(0, 256, (2, 16))}
               for _ in range(2)]
    ns = _run(rendered.files[FILE], monkeypatch, model=model,
              optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataloader=batches)
    from precsearch.backends.emulated import EmulatedBackend

    converted = EmulatedBackend().converted_layers(ns["model"])
    assert converted == {n: p for n, p in layer_table(policy, N).items() if p.is_fp8}
    assert ns["accelerator"].kwargs == {"mixed_precision": "bf16"}
    assert ns["policy"].provenance == {"trial": 5}


def test_bf16_policy_snippet(monkeypatch):
    rendered = render("accelerate", Policy(clip_grad=0.5), N, {})
    assert rendered.warnings == [] and "clip_grad_norm_(model.parameters(), 0.5)" in rendered.files[FILE]
    ns = _run(rendered.files[FILE], monkeypatch)
    assert ns["accelerator"].kwargs == {"mixed_precision": "bf16", "dynamo_plugin": ns["compile_blocks"]}
    assert ns["compile_blocks"].kwargs == COMPILE_BLOCKS


@pytest.mark.parametrize("seed", range(3))
def test_per_module_tensorwise_policy_filters_exactly_those_units(monkeypatch, seed):
    """A per-module space's trial (issue 17): torchao's filter picks exactly its fp8_current units."""
    from _spaces import per_module_policy

    model = _hf_llama()
    policy = per_module_policy(N, seed, ("bf16", "fp8_current"))
    assert choose_path(policy, N)[0] == "ao"
    ns = _run(render("accelerate", policy, N, {}).files[FILE], monkeypatch)
    keep = ns["fp8_kwargs"].kwargs["module_filter_func"]
    chosen = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and keep(m, n)}
    assert chosen == {n for n, p in layer_table(policy, N).items() if p is P.FP8_CURRENT}


def test_per_module_mixed_recipes_run_exactly_through_the_python_api(monkeypatch, tmp_path):
    """Per-unit recipes Accelerate cannot mix fall back to precsearch's API, which converts each unit as the policy says."""
    from _spaces import per_module_policy
    from precsearch.backends.emulated import EmulatedBackend

    policy = per_module_policy(N, 5, ("bf16", "fp8_current", "fp8_block", "mxfp8"))
    rendered = render("accelerate", policy, N, {"trial": 1})
    assert choose_path(policy, N)[0] == "precsearch" and rendered.warnings
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    model = _hf_llama()
    ns = _run(rendered.files[FILE], monkeypatch, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
              dataloader=[])
    converted = EmulatedBackend().converted_layers(ns["model"])
    assert converted == {n: p for n, p in layer_table(policy, N).items() if p.is_fp8}


def test_nvfp4_policy_goes_through_the_python_api_naming_its_switches():
    """Accelerate has no NVFP4 setting: the export must say so, name the switches, and carry them in policy.yaml."""
    import yaml

    policy = Policy(default=Precision.NVFP4, recipe=LayerRecipe(nvfp4_rht=False))
    path, warnings = choose_path(policy, 4)
    assert path == "precsearch"
    assert any("nvfp4_rht=False" in w and "nvfp4_stochastic_rounding=True" in w for w in warnings)
    rendered = render("accelerate", policy, 4, {})
    saved = yaml.safe_load(rendered.files[POLICY_FILE])["policy"]["recipe"]
    assert saved["nvfp4_rht"] is False and saved["nvfp4_2d_weights"] is True


@pytest.mark.parametrize("policy", [Policy(default=P.FP8_CURRENT, clip_grad=1.0),
                                    Policy(rules=(EDGES, Rule("attn", ("*.self_attn.*",), P.FP8_CURRENT)))])
def test_torchao_snippet_trains_every_layer_with_the_real_accelerate(policy):
    """The snippet as a user runs it: optimizer built before ``prepare()``, one step, its blocks compiled;
    every weight must move.

    With ``AORecipeKwargs()``'s default ``enable_fsdp_float8_all_gather=True`` torchao wraps each converted
    weight in a new Parameter that the optimizer does not hold, and those layers silently never trained
    (found on the H200 on 2026-12-03 as a peak 4.9 GiB under the BF16 run's).
    """
    pytest.importorskip("accelerate")
    float8 = pytest.importorskip("torchao.float8.float8_linear")
    torch._dynamo.reset()  # earlier tests' compiles count towards the recompile limit (then blocks run eager)
    model = _hf_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, CFG.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    namespace = {"model": model, "optimizer": optimizer, "dataloader": [{"input_ids": ids, "labels": ids}]}
    exec(compile(render("accelerate", policy, N, {}).files[FILE], FILE, "exec"), namespace)
    trained = namespace["accelerator"].unwrap_model(namespace["model"])
    # regional compilation: each block (and each other top-level part) is wrapped, adding "_orig_mod" to names
    assert all(isinstance(block, torch._dynamo.eval_frame.OptimizedModule) for block in trained.model.layers)
    named = {n.replace("._orig_mod", ""): m for n, m in trained.named_modules()}
    params = {n.replace("._orig_mod", ""): p for n, p in trained.named_parameters()}
    converted = {n for n, m in named.items() if isinstance(m, float8.Float8Linear)}
    assert converted == {n for n, p in layer_table(policy, N).items() if p is P.FP8_CURRENT}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert sorted(params) == sorted(before)
    assert [n for n, p in params.items() if id(p) not in held] == []
    assert [n for n, p in params.items() if torch.equal(p.detach(), before[n])] == []


def _run_with_files(rendered, monkeypatch, tmp_path, **env) -> dict:
    """Write every rendered file into ``tmp_path`` and run the snippet there (it loads ``policy.yaml``)."""
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return _run(rendered.files[FILE], monkeypatch, **env)


def test_a_knob_policys_optimizer_is_prepared_without_device_placement(monkeypatch, tmp_path):
    """precsearch's TE FusedAdam holds its states on the GPU already: Accelerate's device placement would
    round-trip its state_dict (a 16 GiB spike before the first step on the H200, 2026-12-03)."""
    from precsearch.policy import MemoryKnobs

    knobs = Policy(default=P.FP8_CURRENT, memory=MemoryKnobs(master_weights=True, moment_dtype="fp8_block"))
    ns = _run_with_files(render("accelerate", knobs, N, {}), monkeypatch, tmp_path, model=_hf_llama(),
                         learning_rate=1e-3, weight_decay=0.1)
    assert ns["accelerator"].device_placement == [True, False, True]
    assert _run(render("accelerate", Policy(default=P.FP8_CURRENT), N, {}).files[FILE],
                monkeypatch)["accelerator"].device_placement is None


@pytest.mark.parametrize(("policy", "path"), [
    (Policy(default=P.FP8_CURRENT, clip_grad=1.0), "ao"),
    (Policy(default=P.FP8_DELAYED, recipe=LayerRecipe(amax_compute_algo="max")), "te"),
    (Policy(), "bf16"),
    (Policy(rules=(EDGES, Rule("attn", ("*.self_attn.*",), P.FP8_DELAYED), Rule("mlp", ("*.mlp.*",), P.FP8_CURRENT))),
     "precsearch"),
])
def test_the_snippet_builds_precsearchs_optimizer_that_keeps_the_memory_knobs(monkeypatch, tmp_path, policy, path):
    """Issue 52 item 3: Accelerate takes any optimizer, so the snippet builds the one that keeps the optimizer-state
    knobs (FP8 moments, remainder masters) and hands that one to ``prepare()``, on every path."""
    from dataclasses import replace

    from precsearch.backends.fp8_state_adam import FP8StateAdamW
    from precsearch.policy import MemoryKnobs

    policy = replace(policy, memory=MemoryKnobs(master_weights=True, master_dtype="remainders",
                                                moment_dtype="fp8_block"))
    assert choose_path(policy, N)[0] == path
    rendered = render("accelerate", policy, N, {})
    assert POLICY_FILE in rendered.files and "policy.build_optimizer(model" in rendered.files[FILE]
    assert not any("optimizer of your own" in w and "build the optimizer with" in w for w in rendered.warnings)
    ns = _run_with_files(rendered, monkeypatch, tmp_path, model=_hf_llama(), learning_rate=1e-3, weight_decay=0.1,
                         optimizer="the user's: never used")
    optimizer = ns["optimizer"]
    assert isinstance(optimizer, FP8StateAdamW) and ns["accelerator"].prepared[1] is optimizer
    assert optimizer.master == "remainders" and optimizer.storage == {"exp_avg": "fp8_block", "exp_avg_sq": "fp8_block"}
    assert optimizer.defaults["lr"] == 1e-3 and optimizer.defaults["weight_decay"] == 0.1
    # the master is of BF16 parameters: the snippet put the model in BF16 first, and every parameter is held
    params = list(ns["model"].parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert all(id(p) in held for p in params)


def test_a_policy_without_knobs_leaves_the_optimizer_to_the_user(monkeypatch):
    rendered = render("accelerate", Policy(default=P.FP8_CURRENT), N, {})
    assert "build_optimizer" not in rendered.files[FILE] and POLICY_FILE not in rendered.files
    ns = _run(rendered.files[FILE], monkeypatch, optimizer="mine")
    assert ns["accelerator"].prepared[1] == "mine"


def test_the_knob_snippet_trains_with_the_real_accelerate(monkeypatch, tmp_path):
    """The exact-policy path with optimizer-state knobs, as a user runs it with the real Accelerate (no stand-ins):
    the snippet builds ``FP8StateAdamW``, ``prepare()`` wraps it without copying its states, one step trains
    every weight, and the states keep their storage."""
    pytest.importorskip("accelerate")
    from precsearch.backends.fp8_state_adam import FP8StateAdamW
    from precsearch.policy import MemoryKnobs

    policy = Policy(rules=(EDGES, Rule("attn", ("*.self_attn.*",), P.FP8_DELAYED),
                           Rule("mlp", ("*.mlp.*",), P.FP8_CURRENT)),
                    memory=MemoryKnobs(master_weights=True, master_dtype="remainders", moment_dtype="fp8_block"))
    rendered = render("accelerate", policy, N, {})
    assert choose_path(policy, N)[0] == "precsearch"
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    model = _hf_llama()
    ids = torch.randint(0, CFG.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    namespace = {"model": model, "dataloader": [{"input_ids": ids, "labels": ids}], "learning_rate": 1e-2,
                 "weight_decay": 0.0}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # an earlier test's Accelerator fixed another mixed precision
    try:
        exec(compile(rendered.files[FILE], FILE, "exec"), namespace)
    finally:
        AcceleratorState._reset_state(True)
    optimizer = namespace["optimizer"].optimizer  # Accelerate's AcceleratedOptimizer wraps the snippet's
    assert isinstance(optimizer, FP8StateAdamW) and optimizer.master == "remainders"
    trained = namespace["accelerator"].unwrap_model(namespace["model"])
    params = dict(trained.named_parameters())
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert sorted(params) == sorted(before) and all(id(p) in held for p in params.values())
    assert [n for n, p in params.items() if torch.equal(p.detach().float(), before[n].float())] == []
    state = optimizer.state[params["model.layers.1.mlp.up_proj.weight"]]
    assert state["exp_avg"].dtype == torch.float8_e4m3fn and state["step"] == 1
