"""Hugging Face Accelerate export: a Python snippet that sets up FP8 as the policy says.

Verified in huggingface/accelerate (``src/accelerate/utils/dataclasses.py``,
``utils/transformer_engine.py``, ``utils/ao.py``, ``accelerator.py``):

* ``TERecipeKwargs(fp8_format, amax_history_len, amax_compute_algo, margin,
  use_mxfp8_block_scaling, ...)``: the Transformer Engine path converts *every*
  ``nn.Linear`` and wraps the whole ``model.forward`` in one ``fp8_autocast`` with
  one recipe, either ``DelayedScaling`` or ``MXFP8BlockScaling``. It fits only a
  uniform policy. Its ``to_kwargs()`` passes TE only the values that differ from
  Accelerate's own defaults, so ``amax_compute_algo="most_recent"`` (Accelerate's
  default) reaches TE as TE's default ``"max"``, and ``fp8_format="HYBRID"`` reaches
  ``MXFP8BlockScaling`` as its default E4M3: those two cannot be expressed.
* ``AORecipeKwargs(config: torchao Float8LinearConfig, module_filter_func(module,
  fqn) -> bool)``: torchao's ``Float8Linear`` per selected layer, dynamic tensorwise
  scaling (precsearch ``fp8_current``; E4M3 forward, E5M2 gradients by default,
  ``torchao/float8/config.py``) or torchao's named ``rowwise`` config (precsearch
  ``fp8_rowwise``; E4M3 everywhere): one config per model. This is the per-layer path. The snippet sets
  ``enable_fsdp_float8_all_gather=False``: ``AORecipeKwargs()``'s default True makes
  ``Float8Linear.from_float`` wrap each weight in a *new* ``nn.Parameter``
  (``WeightWithDynamicFloat8CastTensor``), and ``Accelerator._prepare_ao`` converts the
  model without re-pointing an optimizer built before ``prepare()``: the converted
  layers then never train (seen with accelerate 1.16 and torchao 0.18 on CPU, and on
  the H200 on 2026-12-03 as 4 bytes per converted weight element under the fixed run's
  peak: no moments for them, their FP32 gradients never cleared).
* With the memory knobs the snippet builds precsearch's optimizer itself (``policy.build_optimizer``, which
  keeps them) and prepares it with ``device_placement=False`` (:data:`_PREPARE_KNOBS`); the export also writes a
  Hugging Face ``Trainer`` set-up that builds the same optimizer (:mod:`precsearch.export.hf_trainer`).

Everything else (delayed scaling per layer, 1x128 blocks, MXFP8 per layer, an FP8
warm-up) has no Accelerate setting; the snippet then uses precsearch's own Python
API (:mod:`precsearch.backends.policy_runtime`), which runs the exact policy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from precsearch.arch.units import HF_BLOCK_PROJS
from precsearch.export.as_run import AsRun, as_searched
from precsearch.export.format_output import (
    Rendered,
    header,
    layer_table,
    warning_lines,
)
from precsearch.export.hf_trainer import FILE as TRAINER_FILE, trainer_file
from precsearch.export.memory_knobs import accelerate_memory, accelerate_written, trainer_memory
from precsearch.policy.file import dump_policy
from precsearch.policy.rules import Policy, block_index
from precsearch.precision import Fp8Format, Precision
from precsearch.recipes import RECIPES, recipe_for

FILE = "accelerate_fp8.py"
POLICY_FILE = "policy.yaml"


def choose_path(policy: Policy, n_layers: int) -> tuple[str, list[str]]:
    """Which Accelerate setup fits: ``bf16``, ``te``, ``ao`` or ``precsearch``; with warnings."""
    table = layer_table(policy, n_layers)
    precs = set(table.values())
    fp8 = {p for p in precs if p.is_fp8}
    warnings: list[str] = []
    if not fp8:
        return "bf16", warnings
    recipe = policy.recipe
    if len(precs) == 1 and recipe_for(next(iter(precs))).accelerate_te:
        problem = recipe_for(next(iter(precs))).accelerate_te_problem(recipe)
        if problem is None:
            return "te", _warmup(policy, warnings)
        warnings.append(problem)
    if _ao_precision(fp8) is not None:  # an E4M3 policy is expressed with a CastConfig for the gradients
        return "ao", _warmup(policy, warnings)
    other = sorted(p.value for p in fp8 if not recipe_for(p).spec.torchao_recipe) or sorted(p.value for p in fp8)
    if len(precs) > 1:
        warnings.append(
            "Accelerate's Transformer Engine path wraps the whole forward in one fp8_autocast with one recipe, "
            "so it cannot run different layers at different precisions")
    for p in sorted(fp8, key=list(RECIPES).index):
        warnings += _unreached_settings(recipe_for(p), recipe)
    warnings.append(
        f"{', '.join(other)} layers have no Accelerate setting (its Transformer Engine path builds only "
        "DelayedScaling or MXFP8BlockScaling, for the whole model; its torchao path only torchao's own recipes, "
        "one per model: dynamic tensorwise or rowwise scaling); the snippet applies the policy with precsearch's "
        "Python API instead (exact numerics; its emulated backend is slower than BF16)")
    return "precsearch", warnings


def _ao_precision(fp8: set[Precision]) -> Precision | None:
    """The one low precision of a policy whose torchao recipe Accelerate's torchao path runs, else None."""
    if len(fp8) != 1:
        return None
    (p,) = fp8
    return p if recipe_for(p).spec.torchao_recipe else None


def _ao_config(recipe_name: str) -> list[str]:
    """The snippet's ``config`` for a torchao recipe that fixes its own formats: torchao's named config as it is
    (its ``enable_fsdp_float8_all_gather`` is False: see the module docstring)."""
    return [f'config = Float8LinearConfig.from_recipe_name("{recipe_name}")']


def _unreached_settings(r, layer) -> list[str]:
    """A warning for a recipe whose own settings (beyond the FP8 format) no Accelerate setting carries."""
    own = [k for k in r.settings if k != "fp8_format"]
    if r.accelerate_te or not own:
        return []
    switches = ", ".join(f"{k}={getattr(layer, k)}" for k in own)
    cap = r.spec.min_capability
    return [f"{r.spec.label} and its recipe switches ({switches}) have no Accelerate setting: TERecipeKwargs "
            f"builds no {r.spec.te_recipe}; they travel in policy.yaml and reach Transformer Engine through "
            f"precsearch's Python API with backend=\"te\" on a GPU of compute capability {cap[0]}.{cap[1]} or newer"]


def accelerate_as_run(policy: Policy, n_layers: int) -> AsRun:
    """What the snippet runs: every path of :func:`choose_path` keeps each layer's precision (TE only for a
    uniform policy, torchao for fp8_current layers, else precsearch's API); FP8 attention is lost, and so is the
    FP8 warm-up on the TE and torchao paths (Accelerate has no setting for it: :func:`_warmup` warns)."""
    path, _ = choose_path(policy, n_layers)
    warmup = 0 if path in _NO_WARMUP else policy.warmup_steps
    return AsRun(as_searched(policy, n_layers).precisions, accelerate_written(policy.memory), warmup,
                 policy.recipe.fp8_format)


#: The paths that run FP8 from the first step: Accelerate's own (TE, torchao) have no FP8 warm-up.
_NO_WARMUP = ("te", "ao")


def _warmup(policy: Policy, warnings: list[str]) -> list[str]:
    if policy.warmup_steps:
        warnings.append(
            f"Accelerate has no FP8 warm-up: the policy runs its first {policy.warmup_steps} steps in BF16. "
            "Train them with mixed_precision='bf16', save_state(), and resume with this setup")
    return warnings


def _py_blocks(blocks: list[int]) -> str:
    """A Python expression for a sorted list of block indices, ranges folded (``[0, *range(2, 9)]``)."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    if len(runs) == 1 and runs[0][1] > runs[0][0]:
        return f"range({runs[0][0]}, {runs[0][1] + 1})"
    items = [str(a) if a == b else f"*range({a}, {b + 1})" for a, b in runs]
    return f"[{', '.join(items)}]"


def _fp8_layers_expr(table: dict[str, Precision], converted: Precision) -> str:
    """Python source of a frozenset holding the HF names of the layers torchao converts (those in ``converted``)."""
    by_proj: dict[str, list[int]] = defaultdict(list)
    singles = []
    for name, p in table.items():
        if p is not converted:
            continue
        block = block_index(name)
        if block is None:
            singles.append(name)
        else:
            by_proj[name.rsplit(".", 1)[-1]].append(block)
    parts = []
    for part, proj in (hf.split(".") for hf in HF_BLOCK_PROJS):
        if proj in by_proj:
            parts.append(f'    *(f"model.layers.{{i}}.{part}.{proj}" for i in {_py_blocks(by_proj[proj])}),')
    parts += [f"    {name!r}," for name in singles]
    return "FP8_LAYERS = frozenset([\n" + "\n".join(parts) + "\n])"


_LOOP = '''\
model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
for step, batch in enumerate(dataloader):
{forward}
    accelerator.backward(loss)
{clip}    optimizer.step()
    optimizer.zero_grad()
'''


#: ``prepare()`` for an optimizer precsearch built (TE ``FusedAdam`` with the memory knobs): no device placement,
#: whose ``state_dict()`` / ``load_state_dict()`` round trip (``AcceleratedOptimizer.__init__``) copies every
#: state: on the H200 (4 blocks at the 8B width, 2026-12-03) the run peaked at 42.99 GiB before its first step,
#: then 27.04 GiB a step (27.14 predicted).
_PREPARE_KNOBS = ("# device_placement=False for the optimizer: its states are on the GPU already, and Accelerate's\n"
                  "# state_dict round trip would copy them all (a 16 GiB spike at 4 blocks of the 8B width)\n"
                  "model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader,\n"
                  "                                                   device_placement=[True, False, True])\n")


#: The bf16 and torchao setups compile each decoder block (Accelerate's regional compilation, applied in
#: ``prepare()`` after torchao's conversion), as torchtitan compiles its blocks: torchao's FP8 casts are
#: separate kernels without ``torch.compile``. Eager, this torchao setup ran at 0.64x of its BF16 run on the
#: H200 (4 blocks at the Llama-3-8B width, 2026-12-03); compiled, at 1.06x of its compiled BF16 run on an H100
#: (2026-12-06, docs/frameworks.md). BF16 is compiled alike, so that the two runs compare like with like.
_COMPILE_BLOCKS = [
    "# each decoder block compiled (Accelerate's regional compilation; ran with accelerate 1.15 and 1.16):",
    "# torchao's FP8 casts fuse into the block's kernels only under torch.compile (4 blocks at the 8B width:",
    "# eager 0.64x of BF16 on an H200, compiled 1.06x on an H100); BF16 setups compile alike, so the two",
    "# compare like with like. Drop dynamo_plugin to run eager.",
    'compile_blocks = TorchDynamoPlugin(backend="inductor", use_regional_compilation=True)',
]


def _knob_optimizer(policy: Policy, *, loaded: bool, has_torch: bool) -> list[str]:
    """The lines that build precsearch's optimizer for the policy's optimizer-state knobs (none without knobs).

    Accelerate has no setting for them, and it takes any optimizer: ``policy.build_optimizer`` gives
    ``FP8StateAdamW`` (FP8 moments; eager off CUDA) or TE ``FusedAdam``, the optimizer the probe trained with.
    It is built before ``prepare()``: torchao's conversion keeps each weight's Parameter (the config above), and
    ``FP8StateAdamW`` adopts the ``te.Linear`` weights Accelerate's Transformer Engine path puts in their place.
    """
    knobs = policy.memory.optimizer_knobs
    if knobs.is_default:
        return []
    lines = [f"# the optimizer-state settings ({', '.join(knobs.changed())}) travel with precsearch's optimizer,",
             "# the one the probe trained with: Accelerate has no setting for them, but takes any optimizer"]
    if not loaded:
        lines += ["from precsearch.policy import load_policy", "",
                  f'policy = load_policy("{POLICY_FILE}")  # written next to this file: the memory settings']
    if policy.memory.master != "none":
        lines += [] if has_torch else ["import torch"]
        lines += ["# BF16 parameters: the optimizer keeps the FP32 master (on the FP32 parameters a Hugging Face model",
                  "# loads by default it would be a second FP32 copy)",
                  "model = model.to(device=accelerator.device, dtype=torch.bfloat16)"]
    else:
        lines.append("model = model.to(accelerator.device)")
    lines += ["# the states are made beside the parameters: build it with the model on its device",
              "optimizer = policy.build_optimizer(model, lr=learning_rate, weight_decay=weight_decay)"]
    return lines


def _loop(policy: Policy, exact: bool) -> str:
    forward = ("    with policy.autocast(model, step):  # BF16 for the warm-up steps, FP8 after\n"
               "        loss = model(**batch).loss" if exact else "    loss = model(**batch).loss")
    clip = (f"    accelerator.clip_grad_norm_(model.parameters(), {policy.clip_grad!r})\n"
            if policy.clip_grad is not None else "")
    loop = _LOOP.format(forward=forward, clip=clip)
    if not policy.memory.optimizer_knobs.is_default:
        loop = loop.replace(_LOOP.splitlines()[0] + "\n", _PREPARE_KNOBS, 1)
    return loop


def accelerate_files(policy: Policy, n_layers: int, provenance: dict[str, Any]) -> Rendered:
    """``accelerate_fp8.py`` (and ``policy.yaml`` when the snippet loads it)."""
    path, warnings = choose_path(policy, n_layers)
    warnings = warnings + accelerate_memory(policy.memory)
    table = layer_table(policy, n_layers)
    recipe = policy.recipe
    lines = header(provenance, f"Hugging Face Accelerate FP8 setup for a {n_layers}-layer Llama 3 "
                               "(LlamaForCausalLM names)")
    lines += warning_lines(warnings)
    if policy.memory.optimizer_knobs.is_default:
        lines.append("# `model`, `optimizer` and `dataloader` are yours; build the optimizer after the model.")
    else:
        lines.append("# `model`, `dataloader`, `learning_rate` and `weight_decay` are yours; the optimizer is built "
                     "below.")
    files: dict[str, str] = {}
    if path == "bf16":
        lines += ["# the policy runs every layer in BF16", "from accelerate import Accelerator",
                  "from accelerate.utils import TorchDynamoPlugin", "", *_COMPILE_BLOCKS,
                  'accelerator = Accelerator(mixed_precision="bf16", dynamo_plugin=compile_blocks)',
                  *_knob_optimizer(policy, loaded=False, has_torch=False), _loop(policy, exact=False)]
    elif path == "te":
        p = next(iter(table.values()))
        lines += [f"# every Linear runs {p.value}: one recipe for the whole model, which is what Accelerate's",
                  "# Transformer Engine path does (one fp8_autocast around model.forward)",
                  "from accelerate import Accelerator", "from accelerate.utils import TERecipeKwargs", ""]
        lines += [f"fp8_kwargs = TERecipeKwargs({recipe_for(p).accelerate_te_kwargs(recipe)})",
                  'accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[fp8_kwargs])',
                  *_knob_optimizer(policy, loaded=False, has_torch=False), _loop(policy, exact=False)]
    elif path == "ao":
        ao = recipe_for(_ao_precision({p for p in table.values() if p.is_fp8}))
        e4m3 = ao.fp8_encoded and recipe.fp8_format is Fp8Format.E4M3
        lines += ["# per-layer FP8 through torchao: Accelerate's Transformer Engine path would wrap the whole",
                  "# forward in one fp8_autocast, so it cannot keep some layers in BF16",
                  "import torch", "from accelerate import Accelerator",
                  "from accelerate.utils import AORecipeKwargs, TorchDynamoPlugin",
                  "from torchao.float8 import " + ("CastConfig, Float8LinearConfig" if e4m3 else "Float8LinearConfig"),
                  "", f"# layers run in FP8 (torchao dynamic {ao.spec.torchao_recipe} scaling = precsearch {ao.name});",
                  "# every other Linear stays BF16",
                  _fp8_layers_expr(table, ao.precision), "", "",
                  "def module_filter_func(module: torch.nn.Module, fqn: str) -> bool:",
                  "    # torchao's scaled GEMM needs both dims divisible by 16 (as Accelerate's own filter checks)",
                  "    return fqn in FP8_LAYERS and module.in_features % 16 == 0 and module.out_features % 16 == 0",
                  "", ""]
        lines += _ao_config(ao.spec.torchao_recipe) if not ao.fp8_encoded else [
                  "config = Float8LinearConfig(",
                  "    pad_inner_dim=True,  # as AORecipeKwargs() sets by default",
                  "    # not AORecipeKwargs()'s default True: that wraps each converted weight in a new Parameter",
                  "    # (for FSDP2's FP8 all-gather), which an optimizer built before prepare() never sees: those",
                  "    # layers would not train",
                  "    enable_fsdp_float8_all_gather=False,"]
        if e4m3:
            lines += ["    # the policy uses E4M3 for gradients too (torchao's default is E5M2)",
                      "    cast_config_grad_output=CastConfig(target_dtype=torch.float8_e4m3fn),"]
        if ao.fp8_encoded:
            lines.append(")")
        lines += ["fp8_kwargs = AORecipeKwargs(config=config, module_filter_func=module_filter_func)",
                  *_COMPILE_BLOCKS,
                  'accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[fp8_kwargs],',
                  "                          dynamo_plugin=compile_blocks)",
                  *_knob_optimizer(policy, loaded=False, has_torch=True), _loop(policy, exact=False)]
    else:
        lines += ["# the exact policy through precsearch's Python API: Accelerate has no setting for it",
                  "from accelerate import Accelerator", "from precsearch.policy import load_policy", "",
                  f'policy = load_policy("{POLICY_FILE}")  # written next to this file',
                  'accelerator = Accelerator(mixed_precision="bf16")',
                  "# before prepare() and before building the optimizer; backend=\"te\" runs it on Transformer",
                  "# Engine where precsearch supports that, the default \"emulated\" runs anywhere (slower than BF16)",
                  "model = policy.apply(model)",
                  *_knob_optimizer(policy, loaded=True, has_torch=False), _loop(policy, exact=True)]
    knobs = not policy.memory.optimizer_knobs.is_default
    if path == "precsearch" or knobs:
        files[POLICY_FILE] = dump_policy(policy, provenance)
    if knobs:  # Trainer takes precsearch's optimizer too
        files[TRAINER_FILE] = trainer_file(policy, n_layers, provenance, POLICY_FILE, trainer_memory(policy.memory))
    files[FILE] = "\n".join(lines).rstrip("\n") + "\n"
    return Rendered(files, warnings)


__all__ = ["FILE", "POLICY_FILE", "TRAINER_FILE", "accelerate_as_run", "accelerate_files", "choose_path"]
