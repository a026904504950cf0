"""One framework run of ``benchmarks/bench_frameworks.py``, in its own process (a CUDA GPU).

    python benchmarks/frameworks_runs.py SPEC.json RESULT.json

SPEC: ``framework`` (megatron | torchtitan | accelerate | probe), ``policy`` (a name of
:data:`frameworks_plan.POLICIES`, or any name with ``policy_dict``: the policy as ``Policy.to_dict``, a study's
trial), ``shape`` (:class:`frameworks_plan.Shape` fields), ``export_dir`` (the files precsearch exported
for this run). RESULT: tokens/s (median step gap after the warm-up steps), peak GiB
(``max_memory_allocated`` over the run), per-phase peaks of the steady steps (forward, backward, optimizer
step; the counter is reset before each) and per-phase times of the timed steps (CUDA events, median ms), the losses, and the per-module check (each module's precision in its
latest forward against the policy's). A failure is written as ``error`` with the traceback's last lines.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import frameworks_plan as plan  # noqa: E402

GIB = 2**30
SEED, LR, BETAS, WEIGHT_DECAY = 0, 1e-4, (0.9, 0.95), 0.1
PHASES = ("forward", "backward", "step")


def batches(shape: plan.Shape, device) -> list:
    """(input ids, targets) per step: uniform random ids from one seeded generator (the same in every run)."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, shape.vocab, (shape.steps, shape.mb, shape.seq + 1), generator=gen)
    return [(b[:, :-1].to(device), b[:, 1:].to(device)) for b in ids]


def train(shape: plan.Shape, forward: Callable[[int], Any], backward: Callable[[Any], None],
          step: Callable[[], None]) -> dict[str, Any]:
    """Run ``shape.steps`` steps; time, memory per phase (steady steps: every step after the first), time per
    phase (the timed steps: those after the warm-up), losses."""
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    phase_peak = dict.fromkeys(PHASES, 0)
    marks: list[tuple[str, Any, Any]] = []  # (phase, start event, end event) of the timed steps
    ends, losses, first_peak = [], [], 0
    for s in range(shape.steps):
        steady, timed = s > 0, s >= shape.warmup_steps
        for phase, run in (("forward", lambda: forward(s)), ("backward", lambda: backward(loss)), ("step", step)):
            if steady:
                torch.cuda.reset_peak_memory_stats()
            if timed:
                marks.append((phase, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                marks[-1][1].record()
            out = run()
            if timed:
                marks[-1][2].record()
            if phase == "forward":
                loss = out
            if steady:
                phase_peak[phase] = max(phase_peak[phase], torch.cuda.max_memory_allocated())
        if s == 0:
            first_peak = torch.cuda.max_memory_allocated()
        torch.cuda.synchronize()
        ends.append(time.perf_counter())
        losses.append(float(loss.detach().float()))
        del loss
    gaps = [b - a for a, b in zip(ends, ends[1:])][shape.warmup_steps - 1:]
    return {"tokens_per_s": shape.mb * shape.seq / statistics.median(gaps), "phase_ms": phase_times(marks),
            "peak_gib": max(first_peak, *phase_peak.values()) / GIB, "start_gib": base / GIB,
            "phase_peak_gib": {p: v / GIB for p, v in phase_peak.items()},
            "first_loss": losses[0], "last_loss": losses[-1], "losses": losses}


def phase_times(marks: list[tuple[str, Any, Any]]) -> dict[str, float]:
    """Median ms of each phase over its (start, end) event pairs (recorded, the device synchronized since)."""
    times: dict[str, list[float]] = {}
    for phase, start, end in marks:
        times.setdefault(phase, []).append(start.elapsed_time(end))
    return {phase: statistics.median(ms) for phase, ms in times.items()}


#: Elements of each weight kept before the run to tell afterwards whether it moved.
FINGERPRINT = 4096


def fingerprints(model) -> dict[str, Any]:
    """:data:`FINGERPRINT` elements spread evenly over every 2-D parameter, by name (a few MB of host memory).
    Spread, not the first ones: an embedding's first row is one token's, which random batches may never
    draw, and weight decay alone moves a BF16 weight by less than its rounding step (H200, 2026-12-03)."""
    out = {}
    for n, p in model.named_parameters():
        if p.dim() == 2:
            flat = p.detach().flatten()
            sample = flat[::max(1, flat.numel() // FINGERPRINT)][:FINGERPRINT]
            out[plan.uncompiled_name(n)] = sample.float().cpu().clone()
    return out


def trained(before: dict[str, Any], model, optimizer=None) -> dict[str, Any]:
    """:func:`frameworks_plan.check_training` of the run: which weights moved, which the optimizer holds
    (``optimizer=None``: not checked, for an optimizer that holds copies)."""
    import torch

    after = fingerprints(model)
    params = {plan.uncompiled_name(n): p for n, p in model.named_parameters()}
    held = None
    if optimizer is not None:
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        held = {n for n, p in params.items() if id(p) in ids}
    moved = {n for n in after if n in before and not torch.equal(before[n], after[n])}
    return plan.check_training(sorted(after), moved, sorted(params), held)


def resident_parts(model, optimizer) -> dict[str, float]:
    """GiB the run keeps between steps, by part: parameters (by dtype), gradients, the optimizer's states."""
    import torch

    parts: dict[str, float] = {}
    for p in model.parameters():
        key = f"params_{str(p.dtype).removeprefix('torch.')}"
        parts[key] = parts.get(key, 0.0) + p.numel() * p.element_size() / GIB
        if p.grad is not None:
            parts["grads"] = parts.get("grads", 0.0) + p.grad.numel() * p.grad.element_size() / GIB
    seen = set()
    for state in optimizer.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor) and t.is_cuda and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                parts["optimizer_state"] = parts.get("optimizer_state", 0.0) + t.numel() * t.element_size() / GIB
    return parts


def te_observed(model, prefix: str = "") -> dict[str, str]:
    """TE module path -> the precision its latest forward ran (``module.fp8``, ``fp8_meta["recipe"]``)."""
    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, TransformerEngineBaseModule) and hasattr(m, "fp8_meta"):
            recipe = m.fp8_meta.get("recipe")
            out[prefix + name] = plan.te_module_precision(bool(getattr(m, "fp8", False)), _te_recipe_class(recipe))
    return out


def _te_recipe_class(recipe) -> str | None:
    """The TE recipe class ``recipe`` is, by name: Megatron-Core passes its own subclasses (e.g.
    ``TEDelayedScaling`` of ``DelayedScaling``), so the first class of its MRO that TE defines."""
    if recipe is None:
        return None
    names = [c.__name__ for c in type(recipe).__mro__]
    return next((n for n in names if n in plan.TE_RECIPES), names[0])


# --- Megatron-Core -------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def megatron_model(shape: plan.Shape, mplan: dict[str, Any], export_dir: Path):
    """GPTModel with the TE layer spec, the exported flags as TransformerConfig fields, the YAML as quant_recipe."""
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not torch.distributed.is_initialized():
        torch.cuda.set_device(0)
        torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                                             world_size=1)
        parallel_state.initialize_model_parallel()
        tensor_parallel.model_parallel_cuda_manual_seed(SEED)
    quant = None
    if mplan["quant_recipe"]:
        from megatron.core.quantization.quant_config import RecipeConfig

        quant = RecipeConfig.from_yaml_file(str(export_dir / plan.CONFIG_FILE))
    config = TransformerConfig(
        num_layers=shape.layers, hidden_size=shape.dim, ffn_hidden_size=shape.ffn,
        num_attention_heads=shape.heads, num_query_groups=shape.kv_heads, normalization="RMSNorm",
        layernorm_epsilon=1e-5, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, quant_recipe=quant, **(plan.MEGATRON_LM_DEFAULTS | mplan["transformer"]))
    model = GPTModel(config, get_gpt_layer_with_transformer_engine_spec(), vocab_size=shape.vocab,
                     max_sequence_length=shape.seq, position_embedding_type="rope", rotary_base=500000,
                     share_embeddings_and_output_weights=False)
    return model.cuda(), config


def megatron_optimizer(model, config, mplan: dict[str, Any]):
    """Megatron's DDP wrapper and its own optimizer (DistributedOptimizer / precision-aware) from the flags."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.uint8}
    fields = {k: dtypes[v] if k in plan._DTYPE_FIELDS else v for k, v in mplan["optimizer"].items()}
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(**mplan["ddp"]), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=LR, weight_decay=WEIGHT_DECAY,
                                                 adam_beta1=BETAS[0], adam_beta2=BETAS[1], bf16=True, **fields),
                                 [ddp])
    return ddp, opt


def run_megatron(spec: dict[str, Any], shape: plan.Shape, policy) -> dict[str, Any]:
    import torch
    from megatron.core import package_info

    export_dir = Path(spec["export_dir"])
    mplan = plan.megatron_plan(policy, shape.layers)
    model, config = megatron_model(shape, mplan, export_dir)
    data = batches(shape, "cuda")
    positions = torch.arange(shape.seq, device="cuda").unsqueeze(0).expand(shape.mb, -1)
    if spec.get("optimizer", "framework") == "adamw":  # torch's fused AdamW on the BF16 parameters, no DDP
        ddp = model  # (a policy with memory knobs is refused before the run: plan.run_memory)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True)

        def zero():
            opt.zero_grad(set_to_none=True)

        def step():
            torch.nn.utils.clip_grad_norm_(model.parameters(), policy.clip_grad)
            opt.step()
    else:
        ddp, opt = megatron_optimizer(model, config, mplan)

        def zero():
            ddp.zero_grad_buffer()
            opt.zero_grad()

        def step():
            ddp.finish_grad_sync()
            opt.step()

    def forward(s):
        zero()
        ids, targets = data[s]
        return ddp(ids, positions, None, labels=targets).float().mean()

    before = fingerprints(model)
    result = train(shape, forward, lambda loss: loss.backward(), step)
    result["trained"] = trained(before, model, opt if ddp is model else None)  # Megatron's holds FP32 copies
    result["modules"] = plan.check_modules(te_observed(model), plan.megatron_expected(policy, shape.layers))
    result["versions"] = {"megatron_core": package_info.__version__}
    result["fusions"] = {k: getattr(config, k) for k in plan.MEGATRON_LM_DEFAULTS}
    result["config"] = {k: mplan[k] for k in ("transformer", "optimizer", "ddp", "quant_recipe")}
    return result


# --- torchtitan (torchao's converter with the exported filter), Accelerate -----------------------------------

def hf_model(shape: plan.Shape):
    """A ``LlamaForCausalLM`` built from a config (no download), FP32 parameters, SDPA attention, on the GPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=shape.dim, intermediate_size=shape.ffn, num_hidden_layers=shape.layers,
                      num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
                      max_position_embeddings=max(shape.seq, 8192), rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(SEED)
    with torch.device("cuda"):
        return LlamaForCausalLM(cfg)


def _versions(*names: str) -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = "not installed"
    return out


def run_torchtitan(spec: dict[str, Any], shape: plan.Shape, policy) -> dict[str, Any]:
    """torchtitan itself (:mod:`frameworks_torchtitan`: its config parser on the exported TOML, its Llama 3, its
    converters, per-block compile, AdamW, loss and clipping) when it imports; else what its converter applies,
    torchao's ``convert_to_float8_training`` with the exported filter, on a Hugging Face model."""
    import frameworks_torchtitan as titan

    if titan.importable():
        return _run_torchtitan_itself(spec, shape, policy)
    return _run_torchao_as_torchtitan(spec, shape, policy)


def _run_torchtitan_itself(spec: dict[str, Any], shape: plan.Shape, policy) -> dict[str, Any]:
    import torch

    import frameworks_torchtitan as titan

    files = {p.name: p for p in Path(spec["export_dir"]).iterdir()}
    torch.manual_seed(SEED)
    run = titan.build(files[plan.TITAN_FILE], shape, "cuda", lr=LR, weight_decay=WEIGHT_DECAY, compile_model=True)
    data = batches(shape, "cuda")

    def forward(s):
        run.optimizer.zero_grad(set_to_none=True)
        return run.forward(*data[s])

    def backward(loss):
        loss.backward()
        run.clip()

    before = fingerprints(run.model)
    result = train(shape, forward, backward, run.optimizer.step)
    result["trained"] = trained(before, run.model, run.optimizer)
    result["modules"] = plan.check_modules(titan.observed(run.model), titan.expected(policy, shape.layers))
    float8 = run.job.quantize.linear.float8  # the exported settings as torchtitan parsed them
    result["torchtitan_job"] = {"converters": list(run.job.model.converters), "recipe_name": float8.recipe_name,
                                "filter_fqns": list(float8.filter_fqns), "max_norm": run.max_norm,
                                "compile": [run.job.compile.enable, list(run.job.compile.components)]}
    result["note"] = (f"torchtitan {titan.VERSION}: the exported TOML parsed by its ConfigManager, its Llama 3, "
                      "converters, per-block torch.compile ([compile] components = model), AdamW, loss and "
                      "clipping; activation checkpointing off")
    result["versions"] = _versions("torchtitan", "torchao", "torch")
    return result


def _run_torchao_as_torchtitan(spec: dict[str, Any], shape: plan.Shape, policy) -> dict[str, Any]:
    """torchao's ``convert_to_float8_training`` with the exported ``filter_fqns`` under torchtitan's substring
    rule, on a Hugging Face ``LlamaForCausalLM``, each block compiled (the runs of 2026-12-03)."""
    import torch

    files = {p.name: p for p in Path(spec["export_dir"]).iterdir()}
    tplan = plan.titan_plan(files)
    note = ("torchtitan not importable here: ran torchao's convert_to_float8_training with the exported "
            "filter_fqns under torchtitan's substring rule")
    model = hf_model(shape)
    if tplan["converters"]:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        filters = tplan["filter_fqns"]

        def keep(module, fqn: str) -> bool:
            return (fqn in plan.hf_expected(policy, shape.layers) and plan.titan_converts(fqn, filters)
                    and module.in_features % 16 == 0 and module.out_features % 16 == 0)

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(tplan["recipe_name"]),
                                   module_filter_fn=keep)
    # torchtitan's apply_compile: each transformer block compiled on its own (the export's comment:
    # "[compile] enable = true"); without it torchao's casts run unfused (FP8 0.63-0.85x of BF16 on the
    # H200, 2026-12-03). The BF16 row is compiled too, so its baseline is torchtitan's.
    for i, block in enumerate(model.model.layers):
        model.model.layers[i] = torch.compile(block)
    note += "; each decoder block torch.compile'd (torchtitan's apply_compile)"
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True)
    before = fingerprints(model)
    result = _hf_train(shape, model, opt, tplan["max_norm"])
    result["trained"] = trained(before, model, opt)
    from torchao.float8.float8_linear import Float8Linear

    observed = {plan.uncompiled_name(n): (plan.P.FP8_CURRENT if isinstance(m, Float8Linear) else plan.P.BF16).value
                for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    result["modules"] = plan.check_modules(observed, plan.hf_expected(policy, shape.layers))
    result["note"], result["versions"] = note, _versions("torchtitan", "torchao", "transformers")
    return result


def _hf_train(shape: plan.Shape, model, opt, max_norm: float) -> dict[str, Any]:
    import torch

    data = batches(shape, "cuda")

    def forward(s):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(input_ids=data[s][0], labels=data[s][1]).loss

    def backward(loss):
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    return train(shape, forward, backward, opt.step)


class _TimedBatches:
    """The snippet's ``dataloader``: the bench's batches, noting a synchronised time as each step starts."""

    def __init__(self, data: list):
        self.data, self.starts, self.resident, self.step_peaks = data, [], [], []

    def __iter__(self):
        import torch

        for ids, targets in self.data:
            torch.cuda.synchronize()
            self.starts.append(time.perf_counter())
            self.resident.append(torch.cuda.memory_allocated())  # what stays between steps: weights, states
            # the peak since the last step started (before the first step: since the run began, prepare())
            self.step_peaks.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            yield {"input_ids": ids, "labels": targets}


def run_accelerate(spec: dict[str, Any], shape: plan.Shape, policy) -> dict[str, Any]:
    """Execute the exported ``accelerate_fp8.py`` as written (model, optimizer and dataloader are ours)."""
    import torch

    # Accelerate imports Transformer Engine lazily, after the first forward has loaded torch's cuDNN; TE's
    # loader then opened the device image's system cuDNN and failed with an undefined symbol (H200,
    # 2026-12-03: the bf16 and torchao-path rows). Importing it first, as the Megatron and probe runs do,
    # loads one cuDNN for both.
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError:
        pass
    export_dir = Path(spec["export_dir"])
    files = {p.name: p for p in export_dir.iterdir()}
    aplan = plan.accelerate_plan(files)
    source = files[plan.ACCELERATE_FILE].read_text()
    note = f"exported snippet, path {aplan['path']}"
    if "use_regional_compilation=True" in source:
        note += "; each decoder block torch.compile'd (Accelerate's regional compilation)"
    if aplan["path"] == "precsearch":  # its own comment: backend="te" runs it on Transformer Engine
        source = source.replace("policy.apply(model)", 'policy.apply(model, backend="te")')
        note += ' (policy.apply(model, backend="te"), as the snippet\'s comment says)'
    model = hf_model(shape)
    assert BETAS == (0.9, 0.95)  # what the snippet's policy.build_optimizer uses (its default betas)
    # with optimizer-state knobs the snippet builds precsearch's optimizer itself (and casts the model to BF16
    # where there is a master); else the optimizer is ours, as the snippet's comment says
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True) \
        if policy.memory.optimizer_knobs.is_default else None
    if opt is None:
        note += "; optimizer: the snippet's policy.build_optimizer (precsearch's, with the policy's knobs)"
    before = fingerprints(model)
    loader = _TimedBatches(batches(shape, "cuda"))
    namespace = {"model": model, "optimizer": opt, "dataloader": loader, "__name__": "accelerate_fp8",
                 "learning_rate": LR, "weight_decay": WEIGHT_DECAY}
    torch.cuda.reset_peak_memory_stats()
    cwd = os.getcwd()
    os.chdir(export_dir)  # the precsearch path loads policy.yaml from beside the snippet
    try:
        exec(compile(source, str(files[plan.ACCELERATE_FILE]), "exec"), namespace)  # noqa: S102 - the export
    finally:
        os.chdir(cwd)
    torch.cuda.synchronize()
    loader.step_peaks.append(torch.cuda.max_memory_allocated())  # the last step's
    ends = loader.starts[1:] + [time.perf_counter()]
    gaps = [b - a for a, b in zip(ends, ends[1:])][shape.warmup_steps - 1:]
    model_out = namespace["accelerator"].unwrap_model(namespace["model"])
    # the optimizer the snippet trained with: ours, or the one it built with policy.build_optimizer
    optimizer = getattr(namespace["optimizer"], "optimizer", namespace["optimizer"])  # Accelerate's wrapper
    result = {"tokens_per_s": shape.mb * shape.seq / statistics.median(gaps),
              "peak_gib": max(loader.step_peaks) / GIB,  # [0]: before the first step, then one per step
              "step_peaks_gib": [b / GIB for b in loader.step_peaks],
              "last_loss": float(namespace["loss"]),
              # resident at the last step's start (states alive), unlike train()'s start_gib (before step 0)
              "start_gib": loader.resident[-1] / GIB,
              "modules": plan.check_modules(_accelerate_observed(model_out), plan.hf_expected(policy, shape.layers)),
              "trained": trained(before, model_out, optimizer), "resident_gib": resident_parts(model_out, optimizer),
              "note": note, "versions": _versions("accelerate", "transformers", "torchao", "transformer_engine")}
    return result


def _accelerate_observed(model) -> dict[str, str]:
    """HF Linear name -> precision it ran: torchao Float8Linear, a TE module's recipe, a precsearch unit's."""
    import torch

    observed = {}
    try:
        observed |= {k.removesuffix(".linear"): v for k, v in te_observed(model).items()}
    except ImportError:
        pass
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        Float8Linear = ()
    for n, m in model.named_modules():
        n = plan.uncompiled_name(n)  # regional compilation wraps each block
        if isinstance(m, Float8Linear):
            observed[n] = plan.P.FP8_CURRENT.value
        elif isinstance(m, torch.nn.Linear) and n not in observed:
            observed[n] = plan.P.BF16.value
    return observed


# --- the probe (precsearch's own training step), for the memory breakdown ------------------------------------

def run_probe(spec: dict[str, Any], shape: plan.Shape, policy) -> dict[str, Any]:
    """precsearch's probe model, TE backend, BF16 parameters, the optimizer Megatron's state matches."""
    import dataclasses

    import torch

    from precsearch.backends import get_backend
    from precsearch.probe.runner import build_probe

    policy = dataclasses.replace(policy, memory=plan.run_memory("probe", policy, spec.get("optimizer", "framework")))
    backend = get_backend("te", torch.device("cuda"))
    model = build_probe(shape.model_config(), policy, backend, torch.device("cuda"), SEED, "bf16")
    opt = backend.build_optimizer(model, policy.memory, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    data = batches(shape, "cuda")

    def forward(s):
        opt.zero_grad(set_to_none=True)
        with backend.autocast(model, True), torch.autocast("cuda", dtype=torch.bfloat16):
            return model(*data[s])

    def backward(loss):
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), policy.clip_grad)

    before = fingerprints(model)
    result = train(shape, forward, backward, opt.step)
    result["trained"] = trained(before, model, opt)
    result["modules"] = plan.check_modules(plan.probe_observed(te_observed(model)),
                                           plan.megatron_expected(policy, shape.layers))
    return result


RUNNERS = {"megatron": run_megatron, "torchtitan": run_torchtitan, "accelerate": run_accelerate,
           "probe": run_probe}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    shape = plan.Shape(**spec["shape"])
    if "policy_dict" in spec:  # a policy not of plan.POLICIES (a study's trial): the bench sends it whole
        from precsearch.policy import Policy

        plan.EXTRA_POLICIES[spec["policy"]] = Policy.from_dict(spec["policy_dict"])
    policy = plan.policy_named(spec["policy"], shape.layers)
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU")
        why = plan.not_runnable(policy, shape.layers, torch.cuda.get_device_capability())
        result = {"error": why} if why else RUNNERS[spec["framework"]](spec, shape, policy)
        result["card"] = torch.cuda.get_device_name()  # what a rate of precsearch.probe.framework_step is keyed by
    except Exception as exc:  # noqa: BLE001 - the row records it; the bench goes on with the next run
        traceback.print_exc()
        tail = traceback.format_exc().strip().splitlines()[-3:]
        result = {"error": f"{type(exc).__name__}: {str(exc)[:400]}", "traceback": tail}
    Path(argv[1]).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
