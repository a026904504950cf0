"""What ``benchmarks/bench_frameworks.py`` runs, built without a GPU: the policies, their exports, and how each
framework reads the exported files (Megatron-Core config fields, torchtitan's filter, Accelerate's snippet).

Everything here is plain data and string handling, so ``--smoke`` and the CPU tests exercise it all; the
GPU side (:mod:`frameworks_runs`) only turns these plans into models and trains them.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from precsearch.arch.config import PRESETS
from precsearch.arch.units import BLOCK_UNITS, OUTPUT_LAYER, hf_linear_names, unit_names
from precsearch.export.format_output import layer_table
from precsearch.probe.memory.frameworks import MEGATRON_STANDARD
from precsearch.export.megatron import ARGS_FILE, CONFIG_FILE, megatron_export, megatron_table
from precsearch.export.registry import as_run, render
from precsearch.export.policy_export import write_export
from precsearch.export.accelerate import FILE as ACCELERATE_FILE, choose_path
from precsearch.export.torchtitan import CONVERTER, FILE as TITAN_FILE, converted_precision, is_filtered, tt_name
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.precision_spec import SPECS

P = Precision
HEAD = Rule(name="head", modules=("output_layer", "lm_head"), precision=P.BF16)
ATTN, MLP = ("*.self_attention.*", "*.self_attn.*"), ("*.mlp.*",)
CLIP = 1.0

#: The policies of the bench: name -> policy. ``bf16`` is every framework's own baseline row.
POLICIES: dict[str, Policy] = {
    "bf16": Policy(clip_grad=CLIP),
    "fp8_current": Policy(rules=(HEAD,), default=P.FP8_CURRENT, clip_grad=CLIP),
    "attn_current+mlp_delayed": Policy(rules=(HEAD, Rule(name="attention", modules=ATTN, precision=P.FP8_CURRENT),
                                              Rule(name="mlp", modules=MLP, precision=P.FP8_DELAYED)),
                                       clip_grad=CLIP),
    "bf16_edges+fp8_current": Policy(rules=(HEAD, Rule(name="edges", modules=("*",), precision=P.BF16,
                                                       first=1, last=1)),
                                     default=P.FP8_CURRENT, clip_grad=CLIP),
    "fp8_current+bf16_moments": Policy(rules=(HEAD,), default=P.FP8_CURRENT, clip_grad=CLIP,
                                       memory=MemoryKnobs(master_weights=True, moment_dtype="bf16")),
    "mxfp8": Policy(rules=(HEAD,), default=P.MXFP8, recipe=LayerRecipe(fp8_format="e4m3"), clip_grad=CLIP),
    # Accelerate's BF16 run as the probe's BF16 row trains: the baseline of its memory-knob rows (baseline_of)
    "bf16+fp32_master": Policy(clip_grad=CLIP, memory=MEGATRON_STANDARD),
}
#: The BF16 row a memory-knob row of Accelerate is set against. That row loads its model in BF16 and trains it
#: with TE ``FusedAdam`` (FP32 master weights), as the export says; Accelerate's own BF16 row keeps FP32
#: parameters under autocast with torch's AdamW, so a speed-up over it mixes FP8's gain with the parameters'
#: dtype and the optimizer's. This one is a BF16 model with FP32 master weights and moments in TE ``FusedAdam``:
#: the state of the probe's and Megatron-Core's BF16 rows, which the probe's knob speed-up is measured against.
BF16_MASTER = "bf16+fp32_master"
#: Framework -> export format.
FRAMEWORKS = {"megatron": "megatron", "torchtitan": "torchtitan", "accelerate": "accelerate"}
#: A policy name with this suffix is the policy as torchtitan runs it (:func:`as_torchtitan_runs`): the probe's
#: row of it is what a torchtitan run of a policy with more than one low precision is compared with.
AS_TORCHTITAN = "@torchtitan"


def as_torchtitan_runs(policy: Policy, n_layers: int) -> Policy:
    """``policy`` with the layers torchtitan's one converter cannot run kept BF16, as its export warns and
    :func:`_breakdown` models: every low precision but :func:`converted_precision`'s becomes BF16."""
    chosen = converted_precision(policy, n_layers)

    def runs(p: Precision) -> Precision:
        return p if p is chosen or not p.is_fp8 else P.BF16

    return replace(policy, rules=tuple(replace(r, precision=runs(r.precision)) for r in policy.rules),
                   default=runs(policy.default))


#: Policies the bench runs beside :data:`POLICIES` under their own names: a study's trials (``trial 12``) under
#: ``bench_frameworks.py --from-study``. Set per study by the bench; a worker gets its policy with its spec.
EXTRA_POLICIES: dict[str, Policy] = {}


def policy_named(name: str, n_layers: int) -> Policy:
    """The bench's policy ``name`` (:data:`POLICIES`, else :data:`EXTRA_POLICIES`), or with :data:`AS_TORCHTITAN`
    the policy as torchtitan runs it."""
    base, suffix, _ = name.partition(AS_TORCHTITAN)
    policy = POLICIES[base] if base in POLICIES else EXTRA_POLICIES[base]
    return as_torchtitan_runs(policy, n_layers) if suffix else policy


def baseline_of(framework: str, name: str) -> str:
    """The policy of the BF16 row that row ``name`` of ``framework`` is set against (speed-up, memory saved):
    :data:`BF16_MASTER` for an Accelerate row that loads its model in BF16 for master weights, else ``bf16``."""
    if (framework == "accelerate" and name != BF16_MASTER
            and param_dtype(framework, policy_named(name, 1).memory) == "bf16"):
        return BF16_MASTER
    return "bf16"


def runs_policy(framework: str, name: str) -> bool:
    """Whether the bench runs policy ``name`` in ``framework``: :data:`BF16_MASTER` is Accelerate's alone (the
    probe's and Megatron-Core's BF16 rows keep that state already; torchtitan's AdamW has no master weights)."""
    return name != BF16_MASTER or framework == "accelerate"


def runs_differently_in_torchtitan(name: str, n_layers: int) -> bool:
    """Whether torchtitan runs policy ``name`` with fewer low-precision layers than the policy gives."""
    policy = policy_named(name, n_layers)
    return as_torchtitan_runs(policy, n_layers) != policy


@dataclass(frozen=True)
class Shape:
    """The model and run shape every framework trains (Llama 3 8B width by default, fewer blocks)."""

    layers: int = 4
    dim: int = 4096
    ffn: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128256
    seq: int = 4096
    mb: int = 1
    steps: int = 10
    warmup_steps: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.warmup_steps < self.steps - 1:
            raise ValueError(f"need 1 <= warmup_steps < steps - 1 (two timed steps), got {self.warmup_steps}, "
                             f"{self.steps}")

    def model_config(self):
        """The probe's :class:`~precsearch.arch.config.ModelConfig` at this shape (the 8B preset resized)."""
        return PRESETS["llama3-8b"].with_overrides(
            n_layers=self.layers, dim=self.dim, ffn_dim=self.ffn, n_heads=self.heads, n_kv_heads=self.kv_heads,
            vocab_size=self.vocab, max_seq_len=max(self.seq, 8192))


def export_files(framework: str, policy: Policy, n_layers: int, out: Path) -> tuple[dict[str, Path], list[str]]:
    """Write the framework's export of ``policy`` into ``out`` with precsearch's own export code."""
    rendered = render(FRAMEWORKS[framework], policy, n_layers, {"study": None})
    paths = write_export(rendered.files, str(out) + "/")
    return {p.name: p for p in paths}, list(rendered.warnings)


def not_runnable(policy: Policy, n_layers: int, capability: tuple[int, int] | None) -> str | None:
    """Why a GPU of ``capability`` cannot run the policy (a precision needs a newer GPU), or None."""
    if capability is None:
        return None
    table = {n: policy.precision_for(n, n_layers) for n in hf_linear_names(n_layers)}
    for p in sorted(set(table.values()), key=list(Precision).index):
        need = SPECS[p].min_capability
        if need is not None and tuple(capability) < need:
            return (f"not runnable on sm_{capability[0]}{capability[1]}: {p.value} needs compute capability "
                    f"{need[0]}.{need[1]} (precision_spec)")
    return None


# --- Megatron-Core -------------------------------------------------------------------------------------------

#: Exported flag -> TransformerConfig field (the flags arguments.py generates from those fields).
MEGATRON_CONFIG_FIELDS = {
    "--fp8-format": "fp8", "--fp8-recipe": "fp8_recipe", "--fp8-margin": "fp8_margin",
    "--fp8-amax-history-len": "fp8_amax_history_len", "--fp8-amax-compute-algo": "fp8_amax_compute_algo",
    "--first-last-layers-bf16": "first_last_layers_bf16", "--num-layers-at-start-in-bf16": "num_layers_at_start_in_bf16",
    "--num-layers-at-end-in-bf16": "num_layers_at_end_in_bf16", "--fp8-output-proj": "fp8_output_proj",
    "--fp4-format": "fp4", "--fp4-recipe": "fp4_recipe", "--fp8-param-gather": "fp8_param",
}
#: TransformerConfig fields whose dataclass default (False) is not what Megatron-LM trains with: its
#: ``megatron/training/arguments.py`` turns them on unless ``--no-bias-swiglu-fusion``, ``--no-rope-fusion``,
#: ``--no-masked-softmax-fusion``, ``--no-bias-dropout-fusion`` are given. Built with the dataclass defaults, the
#: 8B-shape BF16 model ran at 9.4k tok/s and 72.1 GiB on the H200 (2026-12-03), unfused SwiGLU and RoPE.
MEGATRON_LM_DEFAULTS = {"bias_activation_fusion": True, "apply_rope_fusion": True, "masked_softmax_fusion": True,
                        "bias_dropout_fusion": True}
#: Exported flag -> OptimizerConfig field (megatron/training/arguments.py -> megatron/core/optimizer).
MEGATRON_OPTIMIZER_FIELDS = {
    "--use-distributed-optimizer": "use_distributed_optimizer", "--use-precision-aware-optimizer":
    "use_precision_aware_optimizer", "--exp-avg-dtype": "exp_avg_dtype", "--exp-avg-sq-dtype": "exp_avg_sq_dtype",
    "--main-params-dtype": "main_params_dtype", "--clip-grad": "clip_grad",
}
#: Flags with no field to set in a Python-built model: ``--bf16`` (set below), the config file (read apart).
MEGATRON_HANDLED = {"--bf16", "--te-precision-config-file"}
_DTYPE_FIELDS = {"exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype"}


def parse_flags(flags: list[str]) -> dict[str, str | None]:
    """``["--a", "1", "--b"]`` -> ``{"--a": "1", "--b": None}``."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(flags):
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        out[flags[i]] = value
        i += 2 if value is not None else 1
    return out


def _value(text: str | None) -> Any:
    if text is None:
        return True
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def megatron_plan(policy: Policy, n_layers: int) -> dict[str, Any]:
    """The exported flags as ``TransformerConfig`` / ``OptimizerConfig`` / DDP fields (dtype names kept as text).

    Raises:
        ValueError: A flag the export wrote that this mapping does not know (the bench would drop it).
    """
    flags, config, warnings = megatron_export(policy, n_layers)
    args = parse_flags(flags)
    unknown = set(args) - set(MEGATRON_CONFIG_FIELDS) - set(MEGATRON_OPTIMIZER_FIELDS) - MEGATRON_HANDLED
    if unknown:
        raise ValueError(f"exported Megatron flags with no known field: {sorted(unknown)}")
    transformer = {MEGATRON_CONFIG_FIELDS[f]: _value(v) for f, v in args.items() if f in MEGATRON_CONFIG_FIELDS}
    optimizer = {MEGATRON_OPTIMIZER_FIELDS[f]: _value(v) for f, v in args.items() if f in MEGATRON_OPTIMIZER_FIELDS}
    optimizer["clip_grad"] = float(optimizer.get("clip_grad", 0.0))
    if "fp8_recipe" in transformer:
        # Megatron-LM fills OptimizerConfig from every argument that shares a field's name
        # (megatron/training/training.py: get_megatron_optimizer_config), --fp8-recipe among them; under a recipe
        # other than delayed its precision-aware optimizer then keeps whole FP32 main parameters itself rather
        # than handing BF16 + remainders to FusedAdam (optimizer_config.py:
        # use_precision_aware_optimizer_no_fp8_or_ds_fp8). Left out, the run would keep 2 bytes a parameter less.
        optimizer["fp8_recipe"] = transformer["fp8_recipe"]
    ddp = {"use_distributed_optimizer": bool(optimizer.get("use_distributed_optimizer", False)),
           "fp8_param_gather": bool(transformer.get("fp8_param", False))}
    return {"flags": flags, "transformer": transformer, "optimizer": optimizer, "ddp": ddp,
            "quant_recipe": config is not None, "warnings": warnings}


def megatron_expected(policy: Policy, n_layers: int) -> dict[str, str]:
    """Megatron module path -> the precision the policy gives it (``decoder.layers.3.mlp.linear_fc2``)."""
    table, _ = megatron_table(policy, n_layers)
    return {f"decoder.layers.{b}.{m}": p.value for (b, m), p in table.items()}


def uncompiled_name(name: str) -> str:
    """A module path without the ``_orig_mod`` level that ``torch.compile``'s wrapper adds
    (``model.layers.0._orig_mod.mlp.up_proj`` -> ``model.layers.0.mlp.up_proj``)."""
    return name.replace("._orig_mod", "").removeprefix("_orig_mod.")


def probe_observed(te_modules: dict[str, str]) -> dict[str, str]:
    """The probe's TE modules as Megatron's module paths: ``...linear_qkv.linear`` drops its ``.linear``, and
    a fused ``te.LayerNormMLP`` (``...mlp.layernorm_mlp.linear``) runs both ``mlp.linear_fc1`` and
    ``mlp.linear_fc2`` (``precsearch/backends/te_stack.py``)."""
    out = {}
    for name, precision in te_modules.items():
        name = name.removesuffix(".linear")
        if name.endswith(".mlp.layernorm_mlp"):
            mlp = name.removesuffix(".layernorm_mlp")
            out |= {f"{mlp}.linear_fc1": precision, f"{mlp}.linear_fc2": precision}
        else:
            out[name] = precision
    return out


def megatron_decided(files: dict[str, Path], n_layers: int) -> dict[str, str]:
    """Module path -> precision the exported files select, read off them as Megatron reads them.

    The global recipe (``--fp8-recipe``/``--fp4-recipe``) outside the ``--first-last-layers-bf16`` edges,
    unless the first enabled glob matcher of the precision config picks a config (an empty
    ``training_recipe`` is BF16). The GPU run checks the modules themselves; this checks the files.
    """
    args = _sourced_flags(files[ARGS_FILE].read_text())
    glob = _recipe_precision(args.get("--fp8-recipe"), "--fp4-recipe" in args)
    start = int(args.get("--num-layers-at-start-in-bf16") or 0)
    end = int(args.get("--num-layers-at-end-in-bf16") or 0)
    config = yaml.safe_load(files[CONFIG_FILE].read_text()) if CONFIG_FILE in files else {}
    out = {}
    for b in range(n_layers):
        for module in BLOCK_UNITS:
            name = f"decoder.layers.{b}.{module}"
            p = P.BF16 if glob is None or not start <= b < n_layers - end else glob
            hit = next((m["config"] for m in (config.get("matchers") or {}).values()
                        if m["enabled"] and m["type"] == "glob" and fnmatch.fnmatch(name, m["pattern"])), None)
            if hit is not None and p is not P.BF16:
                tr = config["configs"][hit]["training_recipe"]
                p = _recipe_precision(tr.get("fp8_quantization_recipe"), "fp4_quantization_recipe" in tr)
                p = P.BF16 if p is None else p
            out[name] = p.value
    return out


def _sourced_flags(text: str) -> dict[str, str | None]:
    """The flags inside ``PRECSEARCH_MEGATRON_ARGS=( ... )`` of an exported ``megatron_args.sh``."""
    body = text.split("PRECSEARCH_MEGATRON_ARGS=(", 1)[1].split("\n)", 1)[0]
    return parse_flags([tok for line in body.splitlines() for tok in line.split()[:2]])


_MEGATRON_RECIPES = {"delayed": P.FP8_DELAYED, "tensorwise": P.FP8_CURRENT, "blockwise": P.FP8_BLOCK,
                     "mxfp8": P.MXFP8}


def _recipe_precision(fp8_recipe: str | None, fp4: bool) -> Precision | None:
    if fp4:
        return P.NVFP4
    return _MEGATRON_RECIPES[fp8_recipe] if fp8_recipe else None


#: Transformer Engine recipe class a module ran under -> precision (``module.fp8_meta["recipe"]``).
TE_RECIPES = {spec.te_recipe: p for p, spec in SPECS.items() if getattr(spec, "te_recipe", None)}


def te_module_precision(fp8_ran: bool, recipe_class: str | None) -> str:
    """The precision a TE module ran its latest forward in: BF16 unless FP8 was on, else its recipe's."""
    if not fp8_ran:
        return P.BF16.value
    if recipe_class not in TE_RECIPES:
        return f"unknown recipe {recipe_class}"
    return TE_RECIPES[recipe_class].value


# --- torchtitan / torchao, Accelerate ------------------------------------------------------------------------

def titan_plan(files: dict[str, Path]) -> dict[str, Any]:
    """The converter, recipe and ``filter_fqns`` of the exported TOML (``tomllib``: it must parse)."""
    data = tomllib.loads(files[TITAN_FILE].read_text())
    converters = data.get("model", {}).get("converters", [])
    linear = data.get("quantize", {}).get("linear", {})
    section = next((linear[k] for k in ("float8", "mx") if k in linear), None)
    return {"converters": converters, "recipe_name": section and section["recipe_name"],
            "filter_fqns": section["filter_fqns"] if section else [], "max_norm": data["training"]["max_norm"]}


def titan_converts(hf_name: str, filter_fqns: list[str]) -> bool:
    """Whether torchtitan's ``module_filter_fn`` would convert the layer (its torchtitan FQN not filtered)."""
    return not is_filtered(tt_name(hf_name), filter_fqns)


def hf_expected(policy: Policy, n_layers: int) -> dict[str, str]:
    """Hugging Face Linear name -> the precision the policy gives it."""
    return {n: p.value for n, p in layer_table(policy, n_layers).items()}


def accelerate_plan(files: dict[str, Path]) -> dict[str, Any]:
    """Which path the exported snippet takes, read off its source (it must compile)."""
    source = files[ACCELERATE_FILE].read_text()
    compile(source, str(files[ACCELERATE_FILE]), "exec")
    path = ("precsearch" if "policy.apply(model)" in source else "ao" if "AORecipeKwargs(" in source
            else "te" if "TERecipeKwargs(" in source else "bf16")
    return {"path": path, "file": str(files[ACCELERATE_FILE])}


def check_modules(observed: dict[str, str], expected: dict[str, str]) -> dict[str, Any]:
    """Every expected module observed with its precision: counts and the mismatches (name, policy, ran)."""
    wrong = [(n, want, observed.get(n, "missing")) for n, want in expected.items() if observed.get(n) != want]
    return {"modules": len(expected), "ok": len(expected) - len(wrong), "mismatches": wrong[:20],
            "n_mismatches": len(wrong)}


def check_training(matrices: list[str], moved: set[str], params: list[str], held: set[str] | None) -> dict[str, Any]:
    """Did the run train every weight? ``matrices``: the 2-D parameters (Linear and embedding weights, whose
    Adam updates outgrow a BF16 step in a few steps; a norm's weight of 1.0 would not), ``moved``: those that
    changed; ``params``: every parameter, ``held``: those the optimizer holds (None where it holds copies,
    as Megatron-Core's FP32 main parameters). Not trained: a matrix that did not move or a parameter the
    optimizer does not hold."""
    lost = [n for n in params if held is not None and n not in held]
    still = [n for n in matrices if n not in moved]
    return {"matrices": len(matrices), "moved": len(matrices) - len(still),
            "not_in_optimizer": lost[:10], "n_not_in_optimizer": len(lost), "unmoved": still[:10],
            "ok": not lost and not still}


#: What Megatron's optimizer keeps by default (BF16 parameters, FP32 main parameters, FP32 moments).
MEGATRON_MEMORY = MEGATRON_STANDARD
#: Parameter dtype each framework trains with in the bench: Megatron BF16 (with FP32 main parameters),
#: the torchao and Accelerate runs FP32 parameters under BF16 autocast (as Hugging Face models load).
PARAM_DTYPE = {"megatron": "bf16", "torchtitan": "fp32", "accelerate": "fp32", "probe": "bf16"}


def param_dtype(framework: str, memory: MemoryKnobs) -> str:
    """The parameter dtype of the framework's run: :data:`PARAM_DTYPE`, except an Accelerate run with master
    weights, whose exported snippet says to load the model in BF16 (the master keeps the FP32 copy)."""
    if framework == "accelerate" and memory.master != "none":
        return "bf16"
    return PARAM_DTYPE[framework]


def fp8_linear(framework: str, policy: Policy, layers: int) -> str:
    """Which FP8 Linear the framework's run uses (:data:`~precsearch.probe.memory.peak.FP8_LINEARS`): torchao's
    for torchtitan's converter and Accelerate's torchao path, Transformer Engine's for every other run."""
    if framework == "torchtitan" or (framework == "accelerate" and choose_path(policy, layers)[0] == "ao"):
        return "torchao"
    return "te"


#: The bench's optimizer modes: each framework's own (Megatron-Core's DDP + ``get_megatron_optimizer``), or
#: torch's fused AdamW on the BF16 parameters for Megatron and the probe (no FP32 master: the only state that
#: fits the full 8B depth on one H200, as the 2026-12-01 full-depth runs trained).
OPTIMIZERS = ("framework", "adamw")


def run_memory(framework: str, policy: Policy, optimizer: str = "framework",
               n_layers: int | None = None) -> MemoryKnobs:
    """The training state the framework keeps for the policy at ``n_layers`` blocks (needed for Megatron's knobs):
    its knobs, Megatron's default state, or the state Megatron keeps under the exported flags, as a study with
    ``target: megatron`` scores it (whole FP32 main parameters under tensorwise or blockwise FP8, BF16 for
    ``fp8_block`` moments: :func:`~precsearch.export.memory_knobs.megatron_written`)."""
    if optimizer == "adamw":
        if policy.memory != MemoryKnobs():
            raise ValueError("--optimizer adamw trains the default knobs only (torch AdamW on the parameters)")
        return policy.memory
    if framework in ("megatron", "probe") and policy.memory == MemoryKnobs():
        return MEGATRON_MEMORY
    if framework == "megatron":
        if n_layers is None:
            raise ValueError("run_memory('megatron') of a policy with memory knobs needs n_layers (its export)")
        return as_run("megatron", policy, n_layers).memory
    if framework == "torchtitan":  # its AdamW keeps the parameters' dtype: no knob is expressible (warned)
        return MemoryKnobs()
    return policy.memory


def compiled_run(framework: str, note: str | None = None, policy: Policy | None = None,
                 layers: int | None = None) -> bool:
    """Whether the framework's run compiles its blocks: every torchtitan run since 2026-12-03 (call 4), as its
    export says, and an Accelerate run of the bf16 or torchao setup since 2026-12-06 (its export's regional
    compilation; ``policy`` and ``layers`` pick the setup). A recorded row's ``note`` says so ("compile"); the
    eager rows of the calls before do not."""
    if note:
        return framework in ("torchtitan", "accelerate") and "compile" in note
    if framework == "accelerate":
        if policy is None or layers is None:
            raise ValueError("compiled_run('accelerate') needs a row's note, or the policy and layers (its setup)")
        return choose_path(policy, layers)[0] in ("bf16", "ao")
    return framework == "torchtitan"


def predicted_peak_gib(policy: Policy, shape: Shape, framework: str, optimizer: str = "framework",
                       compiled: bool | None = None) -> float:
    """precsearch's memory model (:func:`~precsearch.probe.memory.peak.predict_peak`) for the framework's run,
    with the framework's own optimizer step where the model knows it
    (:func:`~precsearch.probe.memory.frameworks.framework_peak`: Megatron-Core's standard optimizer); under
    ``optimizer="adamw"`` Megatron's model trains with torch's AdamW, the probe's step. ``compiled``: the run
    compiles its blocks (default :func:`compiled_run`), counted by the model's compiled rule
    (:mod:`precsearch.probe.memory.compiled`)."""
    from precsearch.probe.memory.frameworks import framework_peak

    memory = run_memory(framework, policy, optimizer, shape.layers)
    compiled = compiled_run(framework, policy=policy, layers=shape.layers) if compiled is None else compiled
    b = _breakdown(policy, shape, framework, optimizer, compiled)
    return framework_peak(framework if optimizer == "framework" else "probe", b, memory) / 2**30


def calibrated_peak_gib(policy: Policy, shape: Shape, probe_peaks: dict[int, float],
                        optimizer: str = "framework") -> float:
    """The probe's memory model at ``shape`` calibrated on the probe's measured peaks at other depths
    (blocks -> GiB), as a trial calibrates on its own short probes
    (:func:`~precsearch.probe.memory.calibration.fit_calibration`)."""
    import dataclasses

    from precsearch.probe.memory.calibration import DepthMeasurement, fit_calibration

    points = [DepthMeasurement(n, _breakdown(policy, dataclasses.replace(shape, layers=n), "probe", optimizer).total,
                               int(gib * 2**30)) for n, gib in sorted(probe_peaks.items())]
    calibration = fit_calibration(points)
    return calibration.correct(_breakdown(policy, shape, "probe", optimizer).total, shape.layers) / 2**30


def _breakdown(policy: Policy, shape: Shape, framework: str, optimizer: str, compiled: bool = False):
    """The memory model's breakdown for the framework's run of the policy at the shape."""
    from precsearch.probe.memory.peak import predict_peak

    cfg = shape.model_config()
    precisions = {n: policy.precision_for(n, cfg.n_layers) for n in unit_names(cfg)}
    precisions[OUTPUT_LAYER] = policy.precision_for(OUTPUT_LAYER, cfg.n_layers)
    if framework == "torchtitan":  # one converter: its other FP8 layers stay BF16 (the export warns)
        chosen = converted_precision(policy, cfg.n_layers)
        precisions = {n: p if p is chosen or not p.is_fp8 else Precision.BF16 for n, p in precisions.items()}
    return predict_peak(cfg, precisions, seq_len=shape.seq, micro_batch=shape.mb,
                        param_dtype=param_dtype(framework, policy.memory),
                        memory=run_memory(framework, policy, optimizer, shape.layers),
                        fp8_linear=fp8_linear(framework, policy, cfg.n_layers), compiled_blocks=compiled)


def shape_dict(shape: Shape) -> dict[str, int]:
    """The shape as JSON."""
    return asdict(shape)
