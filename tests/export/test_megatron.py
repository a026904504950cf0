"""Megatron export: name mapping, flags, the precision config file, and what cannot be expressed.

When megatron-core is importable (``pip install megatron-core``: 0.16.1 installs on
CPU), the generated YAML is loaded with Megatron's own parser
(``megatron/core/quantization/quant_config.py::RecipeConfig.from_yaml_file``), every
matched config is parsed by ``TEQuantizationParams.parse_from_config``, the layer's
effective precision is decided by Megatron's ``_get_should_context_be_quantized_params``
(``megatron/core/extensions/transformer_engine.py``), and the flags are turned into a
``TransformerConfig``, whose ``__post_init__`` checks them. Without it, the structure
is checked against what that source reads.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from _spaces import per_module_policy
from precsearch.arch.units import BLOCK_UNITS, unit_of
from precsearch.export.registry import render
from precsearch.export.megatron import (
    ARGS_FILE,
    CONFIG_FILE,
    megatron_export,
    megatron_name,
    megatron_table,
    nvfp4_environment,
)
from precsearch.policy.rules import PrecisionConflict
from precsearch.recipes.nvfp4 import TE_ENVIRONMENT as NVFP4_ENV
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision

P = Precision
N = 6
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:megatron.*")
EDGES = Rule("edges", ("*",), P.BF16, first=1, last=1)

#: Every flag the exporter may write, checked in NVIDIA/Megatron-LM megatron/training/arguments.py:
#: add_argument('--clip-grad'), ('--te-precision-config-file'); the rest are generated there by
#: ArgumentGroupFactory(TransformerConfig) from megatron/core/transformer/transformer_config.py fields
#: (fp8 -> --fp8-format, fp4 -> --fp4-format via argparse_meta; fp8_output_proj since core_v0.18.0).
VERIFIED_FLAGS = {
    "--bf16", "--fp8-format", "--fp8-recipe", "--fp8-margin", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
    "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16",
    "--fp8-output-proj", "--fp4-format", "--fp4-recipe", "--clip-grad", "--te-precision-config-file",
}
_FIELD = {"--bf16": "bf16", "--fp8-format": "fp8", "--fp8-recipe": "fp8_recipe", "--fp8-margin": "fp8_margin",
          "--fp8-amax-history-len": "fp8_amax_history_len", "--fp8-amax-compute-algo": "fp8_amax_compute_algo",
          "--first-last-layers-bf16": "first_last_layers_bf16",
          "--num-layers-at-start-in-bf16": "num_layers_at_start_in_bf16",
          "--num-layers-at-end-in-bf16": "num_layers_at_end_in_bf16", "--fp8-output-proj": "fp8_output_proj",
          "--fp4-format": "fp4", "--fp4-recipe": "fp4_recipe"}
_RECIPE = {"delayed": P.FP8_DELAYED, "tensorwise": P.FP8_CURRENT, "blockwise": P.FP8_BLOCK, "mxfp8": P.MXFP8}

POLICIES = {
    "edges": Policy(rules=(EDGES, Rule("attn", ("*.self_attn.*",), P.FP8_CURRENT),
                           Rule("mlp", ("*.mlp.*",), P.FP8_BLOCK)), warmup_steps=3, clip_grad=1.0),
    "per_block": Policy(rules=(Rule("b2", ("*",), P.BF16, indices=(2,)), Rule("fc2", ("*.down_proj",), P.MXFP8,
                                                                             last=2),
                               Rule("rest", ("model.*",), P.FP8_CURRENT)), clip_grad=1.0),
    "delayed_edges": Policy(rules=(Rule("first", ("*",), P.BF16, first=1), Rule("all", ("model.*",), P.FP8_DELAYED)),
                            recipe=LayerRecipe(amax_history_len=16, amax_compute_algo="most_recent", margin=1)),
    "delayed_minority": Policy(rules=(Rule("a", ("*.self_attn.*",), P.FP8_DELAYED, first=2),
                                      Rule("b", ("*.self_attn.*",), P.BF16, last=1),
                                      Rule("rest", ("model.*",), P.FP8_CURRENT))),
    "mxfp8_head": Policy(default=P.MXFP8, recipe=LayerRecipe(fp8_format="e4m3")),
    "nvfp4": Policy(rules=(EDGES, Rule("mlp", ("*.mlp.*",), P.NVFP4), Rule("attn", ("*.self_attn.*",), P.FP8_BLOCK))),
    "nvfp4_global": Policy(rules=(Rule("last", ("*",), P.BF16, last=1), Rule("qkv", ("*.q_proj", "*.k_proj",
                                                                                     "*.v_proj"), P.MXFP8)),
                           default=P.NVFP4, recipe=LayerRecipe(nvfp4_rht=False)),
    "bf16": Policy(clip_grad=0.5),
    # per-module spaces: every unit of every block and the head its own precision (issue 17)
    **{f"per_module_{seed}": per_module_policy(N, seed, ("bf16", "fp8_current", "fp8_block", "mxfp8"))
       for seed in range(3)},
    "per_module_nvfp4": per_module_policy(N, 7, ("bf16", "fp8_current", "nvfp4")),
}


def _megatron():
    """Megatron's own parser and decision functions, or None (megatron-core not installed)."""
    try:
        from megatron.core.extensions.transformer_engine import (
            TEQuantizationParams,
            _get_should_context_be_quantized_params,
        )
        from megatron.core.quantization.quant_config import RecipeConfig
        from megatron.core.quantization.utils import get_quant_config_or_none
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError:
        return None
    return RecipeConfig, get_quant_config_or_none, TEQuantizationParams, _get_should_context_be_quantized_params, \
        TransformerConfig


def _flag_dict(flags: list[str]) -> dict[str, str | None]:
    out, i = {}, 0
    while i < len(flags):
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        out[flags[i]] = value
        i += 2 if value is not None else 1
    return out


def _recipe_precision(training_recipe) -> Precision:
    """Precision a per-module TEQuantizationRecipe (parsed by Megatron) selects."""
    if training_recipe.fp4_quantization_recipe is not None:
        return P.NVFP4
    if training_recipe.fp8_quantization_recipe is None:
        return P.BF16
    return _RECIPE[str(getattr(training_recipe.fp8_quantization_recipe, "value",
                                training_recipe.fp8_quantization_recipe))]


def _effective(flags: list[str], config: dict | None, tmp_path: Path, n_layers: int, chunks: int = 1) -> dict:
    """(block, module) -> precision Megatron would run, decided by Megatron's own code when installed.

    With ``chunks`` pipeline chunks, each builds its blocks as decoder.layers.0..k-1 and Megatron's matcher
    sees those local names (GPTModel.named_modules() -> get_quant_config_or_none), while the first/last
    BF16 flags count global layers (fp8_utils.is_first_last_bf16_layer).
    """
    args = _flag_dict(flags)
    glob = P.NVFP4 if "--fp4-recipe" in args else _RECIPE.get(args.get("--fp8-recipe"))
    edges = "--first-last-layers-bf16" in args
    start = int(args["--num-layers-at-start-in-bf16"]) if edges else 0
    end = int(args["--num-layers-at-end-in-bf16"]) if edges else 0
    mc = _megatron()
    recipe = None
    if config is not None:
        assert args["--te-precision-config-file"] == CONFIG_FILE
        path = tmp_path / CONFIG_FILE
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        recipe = mc[0].from_yaml_file(str(path)) if mc else None
    out = {}
    for b in range(n_layers):
        for module in BLOCK_UNITS:
            ctx_quantized = glob is not None and start <= b < n_layers - end
            name = megatron_name(b % (n_layers // chunks), module)
            if mc is None:
                out[b, module] = _effective_from_structure(name, config, ctx_quantized, glob)
                continue
            qc = mc[1](name, recipe)
            params = mc[2].parse_from_config(qc) if qc is not None else None  # raises on a bad config
            if not mc[3](params, True, ctx_quantized):
                out[b, module] = P.BF16
            elif params is not None and (params.training_recipe.override_quantized_autocast if ctx_quantized
                                         else params.training_recipe.override_nonquantized_autocast):
                out[b, module] = _recipe_precision(params.training_recipe)
            else:
                out[b, module] = glob
    return out


_RECIPE_KEYS = {"fp8_quantization_recipe", "fp4_quantization_recipe", "custom_recipe_factory", "fp8_format",
                "override_quantized_autocast", "override_nonquantized_autocast", "tp_only_amax_red"}


def _effective_from_structure(name: str, config: dict | None, ctx_quantized: bool, glob: Precision | None):
    """The same decision read off the structure Megatron's source parses: the first enabled glob
    matcher picks a config; overrides act only inside a quantized context
    (override_nonquantized_autocast defaults to False); an empty training_recipe is BF16."""
    import fnmatch

    if not ctx_quantized:
        return P.BF16
    matchers = (config or {}).get("matchers", {})
    key = next((m["config"] for m in matchers.values()
                if m["enabled"] and m["type"] == "glob" and fnmatch.fnmatch(name, m["pattern"])), None)
    if key is None:
        return glob
    entry = config["configs"][key]
    assert set(entry) == {"transformer_engine_config_type", "training_recipe"}
    assert entry["transformer_engine_config_type"] == "TEQuantizationParams"
    tr = entry["training_recipe"]
    assert set(tr) <= _RECIPE_KEYS and tr.get("fp8_quantization_recipe") != "delayed"
    if not tr:
        return P.BF16
    return P.NVFP4 if "fp4_quantization_recipe" in tr else _RECIPE[tr["fp8_quantization_recipe"]]


def _check_transformer_config(flags: list[str], n_layers: int, pipeline: int = 1) -> None:
    mc = _megatron()
    if mc is None:
        return
    import dataclasses

    fields = {f.name for f in dataclasses.fields(mc[4])}
    kwargs = {}
    for flag, value in _flag_dict(flags).items():
        name = _FIELD.get(flag)
        if name is None or name not in fields:  # --clip-grad, the config file; fp8_output_proj after 0.16
            continue
        kwargs[name] = True if value is None else int(value) if value.isdigit() else value
    if pipeline > 1:
        import torch

        kwargs |= {"pipeline_model_parallel_size": pipeline, "pipeline_dtype": torch.bfloat16}
    mc[4](num_layers=n_layers, hidden_size=64, num_attention_heads=4, **kwargs)  # raises if Megatron refuses


def test_hf_names_map_to_megatron_modules():
    assert unit_of("model.layers.3.self_attn.q_proj") == "decoder.layers.3.self_attention.linear_qkv"
    assert unit_of("model.layers.3.self_attn.v_proj") == "decoder.layers.3.self_attention.linear_qkv"
    assert unit_of("model.layers.0.self_attn.o_proj") == "decoder.layers.0.self_attention.linear_proj"
    assert unit_of("model.layers.1.mlp.gate_proj") == "decoder.layers.1.mlp.linear_fc1"
    assert unit_of("model.layers.1.mlp.up_proj") == "decoder.layers.1.mlp.linear_fc1"
    assert unit_of("model.layers.12.mlp.down_proj") == "decoder.layers.12.mlp.linear_fc2"
    assert unit_of("lm_head") == "output_layer"
    assert unit_of("model.embed_tokens") is None


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_megatron_runs_what_the_policy_says(name, tmp_path):
    """Every flag is a real Megatron flag, Megatron accepts the combination, and each module runs
    the precision the policy (fused modules resolved) gives it."""
    policy = POLICIES[name]
    flags, config, warnings = megatron_export(policy, N)
    assert {f for f in flags if f.startswith("--")} <= VERIFIED_FLAGS
    _check_transformer_config(flags, N)
    table, _ = megatron_table(policy, N)
    assert _effective(flags, config, tmp_path, N) == table


def test_edges_use_first_last_flags_and_a_config_only_for_what_differs():
    flags, config, warnings = megatron_export(POLICIES["edges"], N)
    args = _flag_dict(flags)
    assert args["--fp8-recipe"] == "tensorwise" and args["--fp8-format"] == "hybrid"
    assert "--first-last-layers-bf16" in args
    assert args["--num-layers-at-start-in-bf16"] == "1" and args["--num-layers-at-end-in-bf16"] == "1"
    assert "--fp8-amax-history-len" not in args  # delayed-scaling knobs only with delayed scaling
    assert list(config["matchers"].values()) == [
        {"config": "fp8_blockwise", "type": "glob", "pattern": "decoder.layers.*.mlp.linear_fc1", "enabled": True},
        {"config": "fp8_blockwise", "type": "glob", "pattern": "decoder.layers.*.mlp.linear_fc2", "enabled": True},
    ]
    assert config["configs"] == {"fp8_blockwise": {
        "transformer_engine_config_type": "TEQuantizationParams",
        "training_recipe": {"fp8_quantization_recipe": "blockwise", "fp8_format": "hybrid"}}}
    assert args["--clip-grad"] == "1.0"
    assert any("no FP8 warm-up flag" in w and "first 3 steps" in w for w in warnings)


def test_delayed_scaling_never_gets_first_last_flags_or_a_per_module_config():
    flags, config, warnings = megatron_export(POLICIES["delayed_edges"], N)
    args = _flag_dict(flags)
    assert args["--fp8-recipe"] == "delayed" and "--first-last-layers-bf16" not in args
    assert (args["--fp8-amax-history-len"], args["--fp8-amax-compute-algo"], args["--fp8-margin"]) == (
        "16", "most_recent", "1")
    assert any("refuses --first-last-layers-bf16 with --fp8-recipe delayed" in w for w in warnings)
    assert {m["pattern"] for m in config["matchers"].values()} == {megatron_name(0, m) for m in BLOCK_UNITS}
    assert all(c["training_recipe"].get("fp8_quantization_recipe") != "delayed" for c in config["configs"].values())
    mc = _megatron()
    if mc is not None:  # what the warning is about: Megatron's own check
        with pytest.raises(ValueError, match="Delayed scaling does not support first / last layer in BF16"):
            mc[4](num_layers=N, hidden_size=64, num_attention_heads=4, fp8="hybrid", fp8_recipe="delayed",
                  first_last_layers_bf16=True)


def test_delayed_in_a_minority_still_becomes_the_global_recipe():
    flags, config, _ = megatron_export(POLICIES["delayed_minority"], N)
    assert _flag_dict(flags)["--fp8-recipe"] == "delayed"
    recipes = {c["training_recipe"].get("fp8_quantization_recipe") for c in config["configs"].values()}
    assert "delayed" not in recipes and "tensorwise" in recipes


def test_fused_parts_that_differ_are_refused_naming_the_unit():
    """Megatron computes q/k/v (and gate/up) in one GEMM; a policy splitting them cannot be exported as measured."""
    split = Policy(rules=(Rule("q", ("*.q_proj", "*.up_proj"), P.BF16, first=2), Rule("rest", ("model.*",), P.FP8_CURRENT)))
    with pytest.raises(PrecisionConflict, match=r"decoder\.layers\.0\.self_attention\.linear_qkv.*q_proj: bf16"):
        megatron_table(split, N)
    whole = Policy(rules=(Rule("qkv", ("*.self_attention.linear_qkv",), P.BF16, first=2),
                          Rule("rest", ("model.*",), P.FP8_CURRENT)))
    table, warnings = megatron_table(whole, N)
    assert table[0, "self_attention.linear_qkv"] is P.BF16 and table[2, "self_attention.linear_qkv"] is P.FP8_CURRENT
    assert table[0, "self_attention.linear_proj"] is P.FP8_CURRENT and warnings == []


def test_single_block_matchers_warn_about_pipeline_parallelism():
    flags, config, warnings = megatron_export(POLICIES["per_block"], N)
    patterns = [m["pattern"] for m in config["matchers"].values()]
    assert "decoder.layers.2.self_attention.linear_qkv" in patterns
    assert any("--pipeline-model-parallel-size 1" in w for w in warnings)
    _, _, edge_warnings = megatron_export(POLICIES["edges"], N)
    assert not any("pipeline" in w for w in edge_warnings)


def test_output_layer():
    flags, _, warnings = megatron_export(POLICIES["mxfp8_head"], N)
    assert "--fp8-output-proj" in flags and not any("lm_head" in w for w in warnings)
    policy = Policy(default=P.FP8_CURRENT)
    flags, _, warnings = megatron_export(policy, N)
    assert "--fp8-output-proj" not in flags
    assert any(w.startswith("lm_head is fp8_current") and "kept BF16" in w for w in warnings)


def test_bf16_policy_writes_only_bf16_and_clip():
    rendered = render("megatron", POLICIES["bf16"], N, {})
    assert list(rendered.files) == [ARGS_FILE] and rendered.warnings == []
    flags, config, _ = megatron_export(POLICIES["bf16"], N)
    assert flags == ["--bf16", "--clip-grad", "0.5"] and config is None
    flags, _, _ = megatron_export(Policy(default=P.FP8_CURRENT, clip_grad=None), N)
    assert _flag_dict(flags)["--clip-grad"] == "0.0"  # Megatron's default 1.0 would clip


def test_files_source_in_bash_and_parse_as_yaml(tmp_path):
    rendered = render("megatron", POLICIES["edges"], N, {"study": "s", "trial": 4})
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    assert rendered.files[CONFIG_FILE].startswith("# Megatron-LM --te-precision-config-file")
    assert "WARNING: Megatron has no FP8 warm-up flag" in rendered.files[ARGS_FILE]
    assert "study 's', trial 4" in rendered.files[ARGS_FILE]
    flags, config, _ = megatron_export(POLICIES["edges"], N)
    assert yaml.safe_load(rendered.files[CONFIG_FILE]) == config
    out = subprocess.run(["bash", "-c", f'source "{tmp_path / ARGS_FILE}" && printf "%s\\n" '
                                        '"${PRECSEARCH_MEGATRON_ARGS[@]}"'],
                         capture_output=True, text=True, check=True, cwd="/").stdout.splitlines()
    expected = [str(tmp_path / CONFIG_FILE) if f == CONFIG_FILE else f for f in flags]
    assert out == expected
    mc = _megatron()
    if mc is not None:
        recipe = mc[0].from_yaml_file(out[out.index("--te-precision-config-file") + 1])
        qc = mc[1]("decoder.layers.3.mlp.linear_fc2", recipe)
        assert qc.config_key == "fp8_blockwise"
        assert mc[1]("decoder.layers.3.self_attention.linear_qkv", recipe) is None


def test_memory_knobs_become_megatron_optimizer_flags():
    """FP8 weights -> --fp8-param-gather; BF16 moments -> the precision-aware optimizer with bf16 states."""
    from precsearch.export.megatron import _memory_flags
    from precsearch.policy import MemoryKnobs

    flags, _ = _memory_flags(MemoryKnobs(master_weights=True, moment_dtype="bf16"))
    assert flags == ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
                     "--use-distributed-optimizer"]
    flags, _ = _memory_flags(MemoryKnobs(fp8_weights=True, moment_dtype="bf16"))
    assert flags == ["--fp8-param-gather", "--use-distributed-optimizer"]  # FP8 weights force FP32 moments
    assert _memory_flags(MemoryKnobs()) == ([], [])


# ---- pipeline parallelism ---------------------------------------------------------------------

PP_N = 8
#: Blocks 2 and 6 BF16 (local block 2 of both 4-block stages): expressible with 2 stages, not with 4.
PERIODIC = Policy(rules=(Rule("b2", ("*",), P.BF16, indices=(2, 6)), Rule("rest", ("model.*",), P.FP8_CURRENT)))
#: Only block 3 BF16: with 2 stages, local block 3 is also block 7.
SINGLE = Policy(rules=(Rule("b3", ("*.mlp.*",), P.BF16, indices=(3,)), Rule("rest", ("model.*",), P.FP8_BLOCK)))
#: BF16 edges wider than one pipeline stage allows for the first/last flags.
WIDE_EDGES = Policy(rules=(Rule("edges", ("*",), P.BF16, first=5, last=1), Rule("rest", ("model.*",), P.FP8_CURRENT)))


@pytest.mark.parametrize("name, pipeline", [("PERIODIC", 2), ("edges", 2), ("edges", 3), ("WIDE_EDGES", 2)],
                         ids=["periodic_pp2", "edges_pp2", "edges_pp3", "wide_edges_pp2"])
def test_pipelined_export_runs_what_the_policy_says(name, pipeline, tmp_path):
    """Where the policy's shape allows it, a pipelined run gets every block right: per-block matchers in the
    numbers each stage sees, edges by the global first/last flags (within Megatron's per-stage limit)."""
    policy = POLICIES.get(name) or globals()[name]
    n = 6 if name == "edges" else PP_N
    flags, config, warnings = megatron_export(policy, n, pipeline)
    _check_transformer_config(flags, n, pipeline)
    table, _ = megatron_table(policy, n)
    assert _effective(flags, config, tmp_path, n, chunks=pipeline) == table
    assert not any("pipeline" in w for w in warnings), warnings


def test_wide_edges_are_capped_at_one_stage_and_the_rest_matched():
    flags, config, _ = megatron_export(WIDE_EDGES, PP_N, 2)  # 4 blocks per stage: at most 4 BF16 blocks per end
    args = _flag_dict(flags)
    assert (args["--num-layers-at-start-in-bf16"], args["--num-layers-at-end-in-bf16"]) == ("4", "1")
    assert "decoder.layers.0.self_attention.linear_qkv" in {m["pattern"] for m in config["matchers"].values()}
    flags, _, _ = megatron_export(WIDE_EDGES, PP_N, 1)
    assert _flag_dict(flags)["--num-layers-at-start-in-bf16"] == "5"


def test_what_a_pipeline_cannot_express_is_warned_block_by_block(tmp_path):
    """Block 3 alone BF16 with 2 stages of 4: local block 3 is blocks 3 and 7, which the policy gives different
    precisions. The warning names exactly the blocks that will run otherwise, and Megatron runs just that."""
    flags, config, warnings = megatron_export(SINGLE, PP_N, 2)
    table, _ = megatron_table(SINGLE, PP_N)
    effective = _effective(flags, config, tmp_path, PP_N, chunks=2)
    differ = {k for k in table if effective[k] is not table[k]}
    assert differ, "the case must be one a 2-stage pipeline cannot express"
    assert len(warnings) == 2, warnings  # fc1 and fc2 of block 3
    for (block, module) in differ:
        assert any(f"{module} of blocks {block} runs" in w and "within a chunk (0 to 3)" in w for w in warnings)
    assert not any("--pipeline-model-parallel-size 1" in w for w in warnings)


def test_pp1_export_of_per_block_policy_points_at_the_pipeline_flag():
    _, _, warnings = megatron_export(SINGLE, PP_N)
    assert any("--pipeline-model-parallel-size 1" in w and "--pipeline-parallel N" in w for w in warnings)


def test_uneven_pipeline_split_is_refused():
    from precsearch.errors import UserError

    with pytest.raises(UserError, match="--pipeline-parallel.*do not split evenly"):
        megatron_export(SINGLE, PP_N, 3)
    with pytest.raises(UserError, match="--pipeline-parallel.*megatron only"):
        render("torchtitan", SINGLE, PP_N, {}, pipeline=2)


def test_the_config_path_is_absolute_when_sourced_by_a_relative_path(tmp_path):
    """Sourced as ../m/megatron_args.sh, the YAML path must still hold after the launcher changes directory."""
    rendered = render("megatron", POLICIES["edges"], N, {})
    (tmp_path / "m").mkdir()
    (tmp_path / "work").mkdir()
    for name, text in rendered.files.items():
        (tmp_path / "m" / name).write_text(text)
    script = ('source ../m/megatron_args.sh && cd / && a=("${PRECSEARCH_MEGATRON_ARGS[@]}") && '
              'for i in "${!a[@]}"; do [ "${a[$i]}" = --te-precision-config-file ] && echo "${a[$((i+1))]}"; done; true')
    path = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                          cwd=tmp_path / "work").stdout.strip()
    assert Path(path).is_absolute() and Path(path).resolve() == (tmp_path / "m" / CONFIG_FILE).resolve()


def test_nvfp4_majority_becomes_fp4_flags_with_edges_and_fp8_matchers():
    """NVFP4 as the global recipe: --fp4-format/--fp4-recipe (never beside --fp8-format, which Megatron
    refuses), BF16 end blocks as --num-layers-at-end-in-bf16, MXFP8 q/k/v through the config file."""
    flags, config, _ = megatron_export(POLICIES["nvfp4_global"], N)
    args = _flag_dict(flags)
    assert args["--fp4-format"] == "e2m1" and args["--fp4-recipe"] == "nvfp4" and "--fp8-format" not in args
    assert args["--num-layers-at-start-in-bf16"] == "0" and args["--num-layers-at-end-in-bf16"] == "1"
    assert config["configs"]["mxfp8"]["training_recipe"]["fp8_quantization_recipe"] == "mxfp8"
    assert [m["pattern"] for m in config["matchers"].values()] == ["decoder.layers.*.self_attention.linear_qkv"]


def test_nvfp4_switches_are_exported_as_te_environment(tmp_path):
    """Megatron builds NVFP4BlockScaling() with TE's env defaults: the switches must reach the processes
    as NVTE_NVFP4_DISABLE_* (all three, explicit), and only when some module runs NVFP4."""
    env = nvfp4_environment(POLICIES["nvfp4_global"], N)
    assert env == {"NVTE_NVFP4_DISABLE_RHT": "1", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "0",
                   "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": "0"}
    assert set(NVFP4_ENV.values()) == set(env)
    assert nvfp4_environment(POLICIES["edges"], N) == {}
    rendered = render("megatron", POLICIES["nvfp4_global"], N, {"study": "s", "trial": 1})
    (tmp_path / ARGS_FILE).write_text(rendered.files[ARGS_FILE])
    out = subprocess.run(["bash", "-c", f'source "{tmp_path / ARGS_FILE}" && env | grep ^NVTE_NVFP4 | sort'],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == sorted(f"{k}={v}" for k, v in env.items())
    # TE's recipe reads exactly these names (transformer_engine/common/recipe/__init__.py, NVFP4BlockScaling)
    assert "NVTE_NVFP4" not in render("megatron", POLICIES["edges"], N, {}).files[ARGS_FILE]
