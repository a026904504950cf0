"""Megatron-LM / Megatron-Core export: command-line flags and a ``--te-precision-config-file``.

What Megatron reads (NVIDIA/Megatron-LM, verified in its source):

* FP8 flags: ``--fp8-format {e4m3,hybrid}``, ``--fp8-recipe
  {delayed,tensorwise,blockwise,mxfp8,custom}``, ``--fp8-margin``,
  ``--fp8-amax-history-len``, ``--fp8-amax-compute-algo {max,most_recent}``,
  ``--first-last-layers-bf16``, ``--num-layers-at-start-in-bf16``,
  ``--num-layers-at-end-in-bf16``, ``--fp8-output-proj``, ``--fp4-format e2m1``,
  ``--fp4-recipe nvfp4``, ``--bf16``: fields of ``TransformerConfig`` /
  ``ModelParallelConfig`` (``megatron/core/transformer/transformer_config.py``)
  that ``megatron/training/arguments.py`` turns into flags with
  ``ArgumentGroupFactory`` (before Jan 2026 they were written out with
  ``group.add_argument`` in the same file). ``--clip-grad`` (default 1.0; the
  optimizer clips only when it is > 0) and ``--te-precision-config-file`` are
  plain ``add_argument`` calls there.
* The precision config file (``megatron/core/extensions/TransformerEngineMixedPrecision.md``,
  parsed by ``megatron/core/quantization/quant_config.py::RecipeConfig.from_config_dict``
  and ``megatron/core/extensions/transformer_engine.py::TEQuantizationParams``):
  ``configs`` (name -> ``{transformer_engine_config_type: TEQuantizationParams,
  training_recipe: {fp8_quantization_recipe | fp4_quantization_recipe, fp8_format}}``;
  an empty ``training_recipe`` means BF16) and ordered ``matchers`` (name ->
  ``{config, type: glob, pattern, enabled}``), the first enabled match winning,
  ``fnmatch`` over module paths such as ``decoder.layers.3.self_attention.linear_qkv``.

What cannot be expressed, and is therefore not written (a warning says so):

* (q/k/v and gate/up are fused GEMMs in Megatron; a policy cannot split them: its units are
  Megatron's modules, and :class:`~precsearch.policy.rules.PrecisionConflict` refuses a policy that
  gives their Hugging Face names different precisions.)
* A per-module config may not use delayed scaling (``TEQuantizationRecipe.parse_from_config``
  raises), so delayed scaling can only be the global ``--fp8-recipe``.
* ``--first-last-layers-bf16`` is refused with ``--fp8-recipe delayed``
  (``TransformerConfig.__post_init__``: "Delayed scaling does not support first /
  last layer in BF16."); BF16 edge blocks then become per-module BF16 matchers.
* The output layer is a plain ``ColumnParallelLinear`` (never FP8) unless
  ``--fp8-output-proj`` with ``--fp8-recipe mxfp8``.
* There is no FP8 warm-up flag.
* NVFP4's switches have no flag: Megatron builds ``NVFP4BlockScaling()`` with TE's defaults
  (``megatron/core/fp4_utils.py::get_fp4_recipe``; per module, ``extensions/transformer_engine.py``),
  and TE reads those defaults from ``NVTE_NVFP4_DISABLE_RHT``, ``NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING``
  and ``NVTE_NVFP4_DISABLE_2D_QUANTIZATION`` when it is imported
  (``transformer_engine/common/recipe/__init__.py``). The args file therefore exports all three
  (0 or 1) when the policy runs NVFP4 anywhere.

Pipeline parallelism: each pipeline stage (each model chunk, with a virtual pipeline) builds its
blocks as ``decoder.layers.0 .. k-1`` and Megatron matches the precision config against those
local names (``GPTModel.named_modules()`` -> ``get_quant_config_or_none``), whereas
``--first-last-layers-bf16`` counts global layers (``is_first_last_bf16_layer``). So with
``pipeline`` chunks of ``k`` blocks, a matcher for block ``j`` selects blocks ``j, j + k, ...``:
an export for a pipelined run writes per-block matchers in local numbers, and where blocks that
share a local number need different precisions it keeps the commoner one and warns, naming them.
"""

from __future__ import annotations

from collections import Counter
from fnmatch import fnmatchcase
from typing import Any

import yaml

from precsearch.arch.units import BLOCK_UNITS, HF_OUTPUT_LAYER, OUTPUT_LAYER
from precsearch.export.as_run import AsRun
from precsearch.export.format_output import (
    Rendered,
    block_ranges,
    header,
    warning_lines,
)
from precsearch.errors import UserError
from precsearch.export.memory_knobs import megatron_memory, megatron_written
from precsearch.policy.rules import MemoryKnobs, Policy
from precsearch.precision import Precision
from precsearch.recipes import DEFAULT_PRECISION, RECIPES, recipe_for

#: precsearch precision -> Megatron ``Fp8Recipe`` value (a recipe of 4-bit elements goes to ``--fp4-recipe``).
FP8_RECIPES = {p: r.spec.megatron_recipe for p, r in RECIPES.items()
               if r.spec.megatron_recipe and r.spec.data_bits == 8}
#: Config names in the precision config file (delayed scaling has none: it is a global recipe only).
CONFIG_KEYS = {p: r.spec.megatron_config for p, r in RECIPES.items() if r.spec.megatron_config}
ARGS_FILE = "megatron_args.sh"
CONFIG_FILE = "te_precision_config.yaml"
_TE_TYPE = "TEQuantizationParams"


def megatron_name(block: int | str, module: str) -> str:
    """``decoder.layers.{block}.{module}``: the path Megatron matches precision rules against."""
    return f"decoder.layers.{block}.{module}"


def megatron_table(policy: Policy, n_layers: int) -> tuple[dict[tuple[int, str], Precision], list[str]]:
    """(block, Megatron module) -> precision, and warnings (none: the policy's units are Megatron's modules).

    Raises:
        PrecisionConflict: The policy gives parts of one fused module (q/k/v, gate/up) different precisions.
    """
    out = {(block, module): policy.precision_for(megatron_name(block, module), n_layers)
           for block in range(n_layers) for module in BLOCK_UNITS}
    unnamed = sorted({p for p in out.values() if recipe_for(p).megatron_never}, key=list(RECIPES).index)
    warnings = [f"{p.value} layers kept BF16: {recipe_for(p).megatron_never}" for p in unnamed]
    return {key: DEFAULT_PRECISION if p in unnamed else p for key, p in out.items()}, warnings


def _global_precision(table: dict[tuple[int, str], Precision]) -> Precision | None:
    """The recipe the global flags select: a global-only one (delayed) if any module uses it, else the commonest
    low precision."""
    counts = Counter(p for p in table.values() if p.is_fp8)
    if not counts:
        return None
    global_only = [p for p in counts if recipe_for(p).megatron_global_only]
    if global_only:
        return global_only[0]
    order = list(Precision)
    return min(counts, key=lambda p: (-counts[p], order.index(p)))


def _training_recipe(precision: Precision, fp8_format: str) -> dict[str, Any]:
    return recipe_for(precision).megatron_training_recipe(fp8_format)


def _edge_blocks(table: dict[tuple[int, str], Precision], n_layers: int) -> tuple[int, int]:
    """Leading and trailing blocks whose every module is BF16."""
    def all_bf16(b: int) -> bool:
        return not any(table[b, m].is_fp8 for m in BLOCK_UNITS)

    start = 0
    while start < n_layers and all_bf16(start):
        start += 1
    end = 0
    while end < n_layers - start and all_bf16(n_layers - 1 - end):
        end += 1
    return start, end


def _slot_precision(members: dict[int, Precision], common: Precision) -> Precision:
    """The precision blocks sharing one local number get: their commonest (ties: ``common``, then BF16)."""
    counts = Counter(members.values())
    order = list(Precision)
    return min(counts, key=lambda p: (-counts[p], p is not common, p.is_fp8, order.index(p)))


def _matchers(table: dict[tuple[int, str], Precision], blocks: list[int], glob: Precision, fp8_format: str,
              chunk: int) -> tuple[dict[str, Any], dict[str, Any], bool, list[tuple[int, str, Precision, Precision]]]:
    """(configs, matchers, uses per-block patterns, blocks run otherwise) for every module in ``blocks``.

    Per module kind: the commonest precision over ``blocks`` gets one wildcard matcher
    (unless it is the global recipe, which needs none), preceded by matchers for the local
    block numbers (block mod ``chunk``) that differ from it. First match wins, so exceptions
    come first. Blocks sharing a local number that the policy gives different precisions
    cannot all be served: they are returned as (block, module, policy's, run) precisions.
    """
    configs: dict[str, Any] = {}
    matchers: dict[str, Any] = {}
    per_block = False
    wrong: list[tuple[int, str, Precision, Precision]] = []
    order = list(Precision)

    def use(p: Precision) -> str:
        key = CONFIG_KEYS[p]
        configs.setdefault(key, {"transformer_engine_config_type": _TE_TYPE,
                                 "training_recipe": _training_recipe(p, fp8_format)})
        return key

    for module in BLOCK_UNITS:
        precs = {b: table[b, module] for b in blocks}
        if not precs:
            continue
        counts = Counter(precs.values())
        if recipe_for(glob).megatron_global_only and glob in counts:
            common = glob  # delayed cannot be a per-module override: it must be what no matcher selects
        else:
            common = min(counts, key=lambda p: (-counts[p], p is not glob, order.index(p)))
        short = module.split(".")[-1]
        slots: dict[int, dict[int, Precision]] = {}
        for b, p in precs.items():
            slots.setdefault(b % chunk, {})[b] = p
        for j, members in sorted(slots.items()):
            p = _slot_precision(members, common)
            wrong += [(b, module, want, p) for b, want in members.items() if want is not p]
            if p is not common:
                per_block = True
                matchers[f"layer{j}_{short}_{CONFIG_KEYS[p]}"] = {
                    "config": use(p), "type": "glob", "pattern": megatron_name(j, module), "enabled": True}
        if common is not glob:
            matchers[f"all_{short}_{CONFIG_KEYS[common]}"] = {
                "config": use(common), "type": "glob", "pattern": megatron_name("*", module), "enabled": True}
    return configs, matchers, per_block, wrong


def _pipeline_warnings(wrong: list[tuple[int, str, Precision, Precision]], pipeline: int, chunk: int) -> list[str]:
    """One warning per (module, policy's precision, run precision) the pipeline layout cannot serve."""
    grouped: dict[tuple[str, Precision, Precision], list[int]] = {}
    for b, module, want, got in wrong:
        grouped.setdefault((module, want, got), []).append(b)
    return [f"with {pipeline} pipeline chunks of {chunk} blocks, Megatron's precision matchers see block numbers "
            f"within a chunk (0 to {chunk - 1}), so blocks sharing one cannot differ: {module} of blocks "
            f"{block_ranges(blocks)} runs {got.value} where the policy says {want.value}"
            for (module, want, got), blocks in grouped.items()]


def chunk_layers(n_layers: int, pipeline: int) -> int:
    """Blocks per model chunk of a run with ``pipeline`` chunks (pipeline stages x virtual stages)."""
    if pipeline < 1 or n_layers % pipeline:
        raise UserError(f"{n_layers} blocks do not split evenly into {pipeline} pipeline chunks; valid: a "
                        f"divisor of {n_layers} (uneven first/last stages are not supported)",
                        field="--pipeline-parallel")
    return n_layers // pipeline


def megatron_export(policy: Policy, n_layers: int,
                    pipeline: int = 1) -> tuple[list[str], dict[str, Any] | None, list[str]]:
    """(flags, precision config dict or None, warnings) expressing ``policy`` for Megatron.

    ``pipeline`` is the number of model chunks of the run: ``--pipeline-model-parallel-size``, times
    the virtual stages per rank with an interleaved schedule. The flags refer to the config file as
    ``te_precision_config.yaml`` when one is needed.
    """
    chunk = chunk_layers(n_layers, pipeline)
    table, warnings = megatron_table(policy, n_layers)
    recipe = policy.recipe
    fp8_format = recipe.fp8_format.value
    flags = ["--bf16"]
    config: dict[str, Any] | None = None
    glob = _global_precision(table)
    lm_head = policy.precision_for(HF_OUTPUT_LAYER, n_layers)
    if recipe_for(lm_head).megatron_never:
        warnings.append(f"lm_head is {lm_head.value} in the policy; kept BF16: {recipe_for(lm_head).megatron_never}")
        lm_head = DEFAULT_PRECISION

    if glob is not None:
        flags += recipe_for(glob).megatron_flags(recipe)
        start, end = _edge_blocks(table, n_layers)
        if (start or end) and recipe_for(glob).megatron_global_only:
            warnings.append(
                "Megatron refuses --first-last-layers-bf16 with --fp8-recipe delayed (TransformerConfig: "
                "'Delayed scaling does not support first / last layer in BF16'), so the all-BF16 edge blocks ("
                f"{block_ranges(list(range(start)) + list(range(n_layers - end, n_layers)))}) are kept BF16 "
                "by per-module bf16 matchers in the precision config file instead")
            start = end = 0
        # Megatron allows at most num_layers // pipeline-parallel size BF16 blocks at each end
        start, end = min(start, n_layers // pipeline), min(end, n_layers // pipeline)
        if start or end:
            flags += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(start),
                      "--num-layers-at-end-in-bf16", str(end)]
        configs, matchers, per_block, wrong = _matchers(table, list(range(start, n_layers - end)), glob,
                                                        fp8_format, chunk)
        if matchers:
            config = {"configs": configs, "matchers": matchers}
            flags += ["--te-precision-config-file", CONFIG_FILE]
            if per_block and pipeline == 1:
                warnings.append(
                    "the precision config names single blocks (decoder.layers.N...); Megatron matches them "
                    "against block numbers within one pipeline stage, so these files are for "
                    "--pipeline-model-parallel-size 1; for a pipelined run export with --pipeline-parallel N "
                    "(stages x virtual stages)")
        warnings += _pipeline_warnings(wrong, pipeline, chunk)
        if lm_head is glob and recipe_for(glob).megatron_output_proj:
            flags.append("--fp8-output-proj")
        elif lm_head.is_fp8:
            warnings.append(
                f"lm_head is {lm_head.value} in the policy, but Megatron's output_layer runs BF16 except with "
                "--fp8-output-proj, which needs --fp8-recipe mxfp8 and mxfp8 for the head; kept BF16")
        if policy.warmup_steps and policy.uses_fp8:
            warnings.append(
                f"Megatron has no FP8 warm-up flag: the policy runs its first {policy.warmup_steps} steps in BF16. "
                f"Run them without the FP8 flags (--exit-interval {policy.warmup_steps} with --save stops there "
                "and writes a checkpoint), then resume from it with these flags")
    elif lm_head.is_fp8:
        warnings.append(f"lm_head is {lm_head.value} but no decoder layer is FP8; Megatron cannot run only the "
                        "output layer in FP8; kept BF16")
    recipe = flags[flags.index("--fp8-recipe") + 1] if "--fp8-recipe" in flags else None
    mem_flags, mem_warnings = _memory_flags(policy.memory, recipe)
    flags += mem_flags
    warnings += mem_warnings
    # Megatron's default is 1.0 and it clips only when clip_grad > 0
    flags += ["--clip-grad", repr(float(policy.clip_grad)) if policy.clip_grad is not None else "0.0"]
    return flags, config, warnings


def _memory_flags(memory: MemoryKnobs, fp8_recipe: str | None = None) -> tuple[list[str], list[str]]:
    """Megatron's flags for the policy's training-state settings (:func:`~precsearch.export.memory_knobs.megatron_memory`)."""
    return megatron_memory(memory, fp8_recipe)


def megatron_as_run(policy: Policy, n_layers: int, pipeline: int = 1) -> AsRun:
    """What Megatron runs of :func:`megatron_export`'s files, read back by Megatron's rules: BF16 edge blocks
    (``--first-last-layers-bf16``, global numbers), then the first enabled matcher of the precision config
    (``fnmatch`` on the local module name), then the global recipe; the output layer is FP8 only with
    ``--fp8-output-proj``; no warm-up (there is no flag for it)."""
    flags, config, _ = megatron_export(policy, n_layers, pipeline)

    def value(flag: str) -> str | None:
        return flags[flags.index(flag) + 1] if flag in flags else None

    glob = _recipe_precision({"fp4_quantization_recipe": value("--fp4-recipe")} if "--fp4-recipe" in flags
                             else {"fp8_quantization_recipe": value("--fp8-recipe")} if "--fp8-recipe" in flags
                             else {})
    edges = "--first-last-layers-bf16" in flags
    start = int(value("--num-layers-at-start-in-bf16") or 0) if edges else 0
    end = int(value("--num-layers-at-end-in-bf16") or 0) if edges else 0
    matchers = [m for m in (config or {}).get("matchers", {}).values() if m["enabled"]]
    configs = (config or {}).get("configs", {})
    chunk = chunk_layers(n_layers, pipeline)
    run: dict[str, Precision] = {}
    for block in range(n_layers):
        for module in BLOCK_UNITS:
            local = megatron_name(block % chunk, module)
            hit = next((m for m in matchers if fnmatchcase(local, m["pattern"])), None)
            p = _recipe_precision(configs[hit["config"]]["training_recipe"]) if hit else glob
            run[megatron_name(block, module)] = DEFAULT_PRECISION if block < start or block >= n_layers - end else p
    run[OUTPUT_LAYER] = glob if "--fp8-output-proj" in flags else DEFAULT_PRECISION
    # no FP8 warm-up flag: the files run the recipe from the first step (megatron_export warns)
    warmup = 0 if glob.is_fp8 else policy.warmup_steps
    return AsRun(run, megatron_written(policy.memory, value("--fp8-recipe")), warmup, policy.recipe.fp8_format)


def _recipe_precision(training_recipe: dict[str, Any]) -> Precision:
    """The precision a Megatron ``training_recipe`` (or the global recipe flags, put that way) runs."""
    named = _naming(training_recipe)
    if not named:
        return DEFAULT_PRECISION
    return next(p for p, r in RECIPES.items() if _naming(r.megatron_training_recipe("")) == named)


def _naming(training_recipe: dict[str, Any]) -> dict[str, Any]:
    """The entries of a ``training_recipe`` that name its recipe (set ones, its ``fp8_format`` left out)."""
    return {k: v for k, v in training_recipe.items() if k != "fp8_format" and v}


def nvfp4_environment(policy: Policy, n_layers: int) -> dict[str, str]:
    """TE's NVFP4 environment for the policy's switches ("1" disables), or {} when no module runs NVFP4."""
    table, _ = megatron_table(policy, n_layers)
    environment: dict[str, str] = {}
    for p in sorted(set(table.values()), key=list(RECIPES).index):
        environment |= recipe_for(p).megatron_environment(policy.recipe)
    return environment


def megatron_files(policy: Policy, n_layers: int, provenance: dict[str, Any], pipeline: int = 1) -> Rendered:
    """``megatron_args.sh`` (a bash array of flags) and, when needed, ``te_precision_config.yaml``."""
    flags, config, warnings = megatron_export(policy, n_layers, pipeline)
    files: dict[str, str] = {}
    if config is not None:
        head = header(provenance, f"Megatron-LM --te-precision-config-file for a {n_layers}-layer Llama 3")
        head.append("# format: megatron/core/extensions/TransformerEngineMixedPrecision.md (NVIDIA/Megatron-LM,")
        head.append("# read by --te-precision-config-file since core_v0.16.0)")
        files[CONFIG_FILE] = "\n".join(head + warning_lines(warnings)) + "\n" + yaml.safe_dump(
            config, sort_keys=False)
    lines = header(provenance, f"Megatron-LM precision arguments for a {n_layers}-layer Llama 3")
    lines += [
        "# usage: source this file, then pass \"${PRECSEARCH_MEGATRON_ARGS[@]}\" to pretrain_gpt.py",
    ]
    if "--te-precision-config-file" in flags:
        lines.append("# --te-precision-config-file needs Megatron-LM core_v0.16.0 or newer")
    if "--fp8-output-proj" in flags:
        lines.append("# --fp8-output-proj needs Megatron-LM core_v0.18.0 or newer")
    if pipeline > 1:
        lines.append(f"# for {pipeline} pipeline chunks (--pipeline-model-parallel-size x virtual stages) of "
                     f"{n_layers // pipeline} blocks, split evenly")
    if "--first-last-layers-bf16" in flags:
        lines.append("# --num-layers-at-{start,end}-in-bf16 may not exceed the layers of one pipeline stage")
    lines += warning_lines(warnings)
    env = nvfp4_environment(policy, n_layers)
    if env:
        lines.append("# NVFP4 recipe switches: Transformer Engine reads them when it is imported, so the training")
        lines.append("# processes must inherit them (source this file in the shell that starts the launcher)")
        lines += [f"export {name}={value}" for name, value in env.items()]
    lines.append("PRECSEARCH_MEGATRON_ARGS=(")
    i = 0
    while i < len(flags):
        flag = flags[i]
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        if flag == "--te-precision-config-file":
            # absolute when sourced: a relative dirname would break once the launcher changes directory
            value = f'"$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)/{CONFIG_FILE}"'
        lines.append(f"  {flag}" + (f" {value}" if value is not None else ""))
        i += 2 if value is not None else 1
    lines.append(")")
    files[ARGS_FILE] = "\n".join(lines) + "\n"
    return Rendered(files, warnings)


__all__ = ["ARGS_FILE", "CONFIG_FILE", "NVFP4_ENV", "chunk_layers", "megatron_as_run", "megatron_export",
           "megatron_files", "megatron_name", "megatron_table", "nvfp4_environment"]
