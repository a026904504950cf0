"""torchtitan export: the float8 converter section of a training TOML.

Target: torchtitan v0.2.x (the latest release configured by TOML), verified in
pytorch/torchtitan at tag v0.2.2:

* ``torchtitan/config/job_config.py``: ``[model] converters`` (list of names),
  ``[quantize.linear.float8]`` with ``recipe_name`` (``tensorwise`` | ``rowwise`` |
  ``rowwise_with_gw_hp``), ``filter_fqns`` (modules *not* converted),
  ``enable_fsdp_float8_all_gather``, ``precompute_float8_dynamic_scale_for_fsdp``,
  ``emulate``; ``[training] max_norm`` (always clips; ``inf`` clips nothing).
* ``torchtitan/components/quantization/float8.py`` registers the converter as
  ``quantize.linear.float8``; ``.../quantization/utils.py::module_filter_fn``
  skips a Linear when *any filter string is a substring of its FQN*, or when a
  dimension is not a multiple of 16.
* ``torchtitan/models/llama3/model/model.py``: ``layers.{i}.attention.wq|wk|wv|wo``,
  ``layers.{i}.feed_forward.w1|w2|w3``, ``output``.

torchao's float8 training scales dynamically (tensorwise or rowwise); the
tensorwise recipe is precsearch's ``fp8_current`` with the hybrid format (E4M3
forward, E5M2 gradients: ``torchao/float8/config.py``).

MXFP8 goes through the other converter, ``quantize.linear.mx`` (``[quantize.linear.mx]``:
``recipe_name``, ``filter_fqns``, ``mxfp8_dim1_cast_kernel_choice``; it asserts compute
capability 10.0, ``components/quantization/mx.py``). Its recipe ``mxfp8_cublas_rceil``
rounds each 1x32 block's E8M0 scale up (RCEIL), as Transformer Engine and precsearch's
emulation do (``mxfp8_cublas`` floors it, as the OCP spec writes). torchao's MX training
casts gradients to E4M3 too. torchtitan refuses to combine the ``float8`` and ``mx``
converters (``QuantizationConverter._validate``), so a policy mixing ``fp8_current`` and
``mxfp8`` layers gets the converter that covers more of them; the others stay BF16, as do
delayed scaling, 1x128 blocks and NVFP4 layers (torchtitan v0.2.2 has no NVFP4 converter).

torchtitan v0.1.x spells the same settings ``[model] converters = ["float8"]`` and
``[float8]``; torchtitan after v0.2 is configured in Python
(``Float8LinearConverter.Config``), offers only rowwise recipes and renames modules
(``attention.qkv_linear.wq``, ``lm_head``), so this file does not apply there.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from precsearch.arch.units import HF_OUTPUT_LAYER, hf_names
from precsearch.export.as_run import AsRun, unit_list
from precsearch.export.format_output import (
    Rendered,
    describe_by_block,
    header,
    layer_table,
    warning_lines,
)
from precsearch.export.memory_knobs import torchtitan_memory, torchtitan_written
from precsearch.policy.rules import Policy, block_index
from precsearch.precision import Fp8Format, Precision
from precsearch.recipes import DEFAULT_PRECISION, RECIPES, recipe_for

#: Hugging Face projection -> torchtitan (v0.2) Llama 3 submodule of ``layers.{i}``.
PROJ_NAMES = {
    "q_proj": "attention.wq",
    "k_proj": "attention.wk",
    "v_proj": "attention.wv",
    "o_proj": "attention.wo",
    "gate_proj": "feed_forward.w1",
    "up_proj": "feed_forward.w3",
    "down_proj": "feed_forward.w2",
}
OUTPUT = "output"
FILE = "torchtitan_float8.toml"
#: Each precision a converter expresses: (converter, its section key, recipe name), in the registry's order.
EXPRESSIBLE = {p: r.spec.torchtitan for p, r in RECIPES.items() if r.spec.torchtitan}
#: Section key -> converter: ``float8`` (torchao's float8 training) and ``mx`` (its MX formats).
CONVERTERS = {key: converter for converter, key, _ in EXPRESSIBLE.values()}
CONVERTER = CONVERTERS["float8"]
MX_CONVERTER = CONVERTERS["mx"]
#: The FP8 format each converter runs, whatever the policy's (the TOML has no setting for it): each recipe's
#: ``converter_format`` (torchao's tensorwise recipe casts gradients to E5M2, hybrid; its MX recipes to E4M3).
RUNS_FORMAT = {p: r.converter_format for p, r in RECIPES.items() if p in EXPRESSIBLE}
#: The gradients' element format under each FP8 format.
_GRADIENTS = {Fp8Format.HYBRID: "E5M2", Fp8Format.E4M3: "E4M3"}


def tt_name(hf: str) -> str:
    """HF layer name -> torchtitan FQN (``model.layers.3.mlp.up_proj`` -> ``layers.3.feed_forward.w3``)."""
    if hf == HF_OUTPUT_LAYER:
        return OUTPUT
    block, proj = block_index(hf), hf.rsplit(".", 1)[-1]
    if block is None or proj not in PROJ_NAMES:
        raise ValueError(f"not a Llama 3 Linear name: {hf!r}")
    return f"layers.{block}.{PROJ_NAMES[proj]}"


def is_filtered(fqn: str, filter_fqns: list[str]) -> bool:
    """torchtitan's rule (``module_filter_fn``): a filter entry anywhere inside the FQN skips the module."""
    return any(f in fqn for f in filter_fqns)


def filter_fqns_for(keep_bf16: set[str], n_layers: int) -> list[str]:
    """Short filter entries that skip exactly the torchtitan FQNs in ``keep_bf16``.

    A projection kept BF16 in every block is named once (``attention.wq``), a block
    kept BF16 whole is named by its prefix (``layers.3.``: the dot keeps ``layers.30``
    out), anything else by its full FQN.
    """
    entries: list[str] = []
    covered: set[str] = set()
    for suffix in PROJ_NAMES.values():
        names = {f"layers.{b}.{suffix}" for b in range(n_layers)}
        if names <= keep_bf16:
            entries.append(suffix)
            covered |= names
    for b in range(n_layers):
        names = {f"layers.{b}.{s}" for s in PROJ_NAMES.values()}
        if names <= keep_bf16 and not names <= covered:
            entries.append(f"layers.{b}.")
            covered |= names
    rest = [n for n in sorted(keep_bf16 - covered, key=_fqn_order) if n != OUTPUT]
    entries += rest
    if OUTPUT in keep_bf16:
        entries.append(OUTPUT)
    return entries


def _fqn_order(fqn: str) -> tuple[int, int]:
    parts = fqn.split(".")
    if len(parts) < 2 or not parts[1].isdigit():
        return (1 << 30, 0)
    return int(parts[1]), list(PROJ_NAMES.values()).index(".".join(parts[2:]))


def _chosen(table: dict[str, Precision]) -> Precision | None:
    """The one expressible precision the export uses: the one with more layers (ties: the earlier in the
    registry, fp8_current before mxfp8)."""
    counts = {p: sum(1 for q in table.values() if q is p) for p in EXPRESSIBLE}
    best = max(counts, key=counts.__getitem__)  # max keeps the first of equal counts
    return best if counts[best] else None


def converted_precision(policy: Policy, n_layers: int) -> Precision | None:
    """The one low precision torchtitan runs for the policy (its other FP8 layers stay BF16, as warned)."""
    return _chosen(layer_table(policy, n_layers))


def _lost_warning(p: Precision, names: list[str], chosen: Precision | None) -> str:
    head = f"{len(names)} {p.value} layer(s) ({_describe(names)}) kept BF16: "
    if p in EXPRESSIBLE:
        return head + (f"torchtitan cannot combine its float8 and mx converters, and the {chosen.value} layers "
                       "are more")
    why = recipe_for(p).torchtitan_never
    return head + ("torchtitan's float8 converter (torchao) scales dynamically, tensorwise or rowwise, and its mx "
                   f"converter runs MXFP8 only: there is no {why}")


def torchtitan_export(policy: Policy, n_layers: int) -> tuple[dict[str, Any], list[str]]:
    """(settings, warnings). Settings: ``converters``, ``float8`` and ``mx`` (a section or None), ``max_norm``."""
    table = layer_table(policy, n_layers)
    warnings: list[str] = []
    chosen = _chosen(table)
    low = {n for n, p in table.items() if p is chosen}
    lost: dict[Precision, list[str]] = defaultdict(list)
    for n, p in table.items():
        if p.is_fp8 and p is not chosen:
            lost[p].append(n)
    warnings += [_lost_warning(p, names, chosen) for p, names in lost.items()]
    settings: dict[str, Any] = {"converters": [], "float8": None, "mx": None,
                                "max_norm": policy.clip_grad if policy.clip_grad is not None else math.inf}
    if low:
        keep = {tt_name(n) for n in table if n not in low}
        filters = filter_fqns_for(keep, n_layers)
        # the entries must skip exactly the BF16 layers under torchtitan's substring rule
        assert all(is_filtered(tt_name(n), filters) == (n not in low) for n in table), filters
        converter, key, recipe_name = EXPRESSIBLE[chosen]
        settings["converters"] = [converter]
        settings[key] = {"recipe_name": recipe_name, "filter_fqns": filters}
        warnings += _format_warnings(policy, chosen)
    elif policy.uses_fp8:
        warnings.append("no layer of the policy can run FP8 through torchtitan's float8 or mx converter; "
                        "only [training] max_norm is written")
    if policy.warmup_steps and low:
        warnings.append(
            f"torchtitan has no FP8 warm-up setting: the policy runs its first {policy.warmup_steps} steps in BF16. "
            "Train them without the converter, checkpoint, and resume from that checkpoint with it")
    warnings += torchtitan_memory(policy.memory)
    return settings, warnings


def torchtitan_as_run(policy: Policy, n_layers: int) -> AsRun:
    """What torchtitan runs of :func:`torchtitan_export`'s sections: the converter's precision for every module
    its ``filter_fqns`` leaves in (torchtitan's substring rule), BF16 for the rest; none of the memory knobs, no
    warm-up, and the converter's own gradient format (:data:`RUNS_FORMAT`)."""
    settings, _ = torchtitan_export(policy, n_layers)
    converted = [(p, settings[key]) for p, (_, key, name) in EXPRESSIBLE.items()
                 if settings[key] is not None and settings[key]["recipe_name"] == name]
    run = {}
    for unit in unit_list(n_layers):
        fqn = tt_name(hf_names(unit)[0])  # a unit's names share one precision (PrecisionConflict otherwise)
        run[unit] = next((p for p, section in converted if not is_filtered(fqn, section["filter_fqns"])),
                         DEFAULT_PRECISION)
    chosen = next((p for p, _ in converted), None)
    # no warm-up setting: a converter converts from the first step (torchtitan_export warns)
    return AsRun(run, torchtitan_written(policy.memory), 0 if chosen else policy.warmup_steps,
                 RUNS_FORMAT.get(chosen, policy.recipe.fp8_format))


def _format_warnings(policy: Policy, chosen: Precision) -> list[str]:
    fmt, recipe = policy.recipe.fp8_format, recipe_for(chosen)
    if not recipe.fp8_encoded or fmt is RUNS_FORMAT[chosen]:
        return []
    runs, recipe_name = RUNS_FORMAT[chosen], EXPRESSIBLE[chosen][2]
    return [f"the policy's {recipe.spec.label} gradients are {_GRADIENTS[fmt]} ({fmt.value}), but torchao's "
            f"{recipe_name} recipe casts gradients to {_GRADIENTS[runs]} and the TOML cannot change that; gradient "
            "numerics differ from the probe"]


def _describe(names: list[str]) -> str:
    """``attention q_proj in blocks 0-3; lm_head``: a short account of HF layer names."""
    return describe_by_block(names, lambda name: name.rsplit(".", 1)[-1], PROJ_NAMES)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "inf" if value == math.inf else repr(value)
    if isinstance(value, (int, str, list)):
        return json.dumps(value)  # JSON strings, numbers and lists of them are valid TOML
    raise TypeError(f"cannot write {value!r} as TOML")


def torchtitan_files(policy: Policy, n_layers: int, provenance: dict[str, Any]) -> Rendered:
    """``torchtitan_float8.toml`` (float8 or MX sections): merge them into the job's TOML (torchtitan v0.2.x)."""
    settings, warnings = torchtitan_export(policy, n_layers)
    lines = header(provenance, f"torchtitan (v0.2.x) float8 settings for a {n_layers}-layer Llama 3")
    lines += ["# merge these sections into your train_configs/*.toml",
              "# (v0.1.x spells them [model] converters = [\"float8\"] and [float8];",
              "# v0.3 and later are configured in Python, offer rowwise float8 recipes only and rename the",
              "# modules: these sections do not apply there)"]
    lines += warning_lines(warnings)
    float8, mx = settings["float8"], settings["mx"]
    if float8 is not None or mx is not None:
        lines += ["", "[model]", f"converters = {_toml(settings['converters'])}", ""]
    if float8 is not None:
        lines += [f"[{CONVERTER}]",
                  "# tensorwise dynamic scaling = precsearch fp8_current with hybrid format",
                  f"recipe_name = {_toml(float8['recipe_name'])}",
                  "# layers kept BF16 (a substring match; Linear dims not divisible by 16 are skipped too)",
                  f"filter_fqns = {_toml(float8['filter_fqns'])}",
                  "# torch.compile fuses the casts: [compile] enable = true, components = [\"model\"]"]
    if mx is not None:
        lines += [f"[{MX_CONVERTER}]",
                  "# MXFP8 (1x32 blocks, E8M0 scales rounded up, as TE); needs compute capability 10.0 (Blackwell)",
                  f"recipe_name = {_toml(mx['recipe_name'])}",
                  "# layers kept BF16 (a substring match; Linear dims not divisible by 16 are skipped too)",
                  f"filter_fqns = {_toml(mx['filter_fqns'])}",
                  "# torch.compile is needed for MXFP8 speed: [compile] enable = true, components = [\"model\"]"]
    lines += ["", "[training]", f"max_norm = {_toml(settings['max_norm'])}"]
    return Rendered({FILE: "\n".join(lines) + "\n"}, warnings)


__all__ = ["CONVERTER", "FILE", "MX_CONVERTER", "PROJ_NAMES", "converted_precision", "torchtitan_as_run", "filter_fqns_for", "is_filtered",
           "torchtitan_export", "torchtitan_files", "tt_name"]
