"""precsearch's probe against a plain Transformer Engine Llama 3 stack: speed, memory, FP8 speed-up.

One process, same batches (``TokenBatches.train_batch(step)`` over seeded random ids), for each row:

* reference: ``te.TransformerLayer`` blocks (RMSNorm, SwiGLU, GQA, causal, bshd, fused QKV, no bias,
  no dropout), ``nn.Embedding``, final ``te.RMSNorm``, untied BF16 ``nn.Linear`` head, RoPE angles
  from ``te.RotaryPositionEmbedding`` (no Llama 3.1 scaling: same cost), BF16 parameters, torch AdamW
  (fused by default, as the probe on a GPU), gradients clipped to 1.0, one outer ``te.autocast(enabled=fp8, recipe=R)``
  around forward + float32 cross-entropy. Uniform recipes only: mixed rows compare with its BF16 row.
* probe: ``precsearch.probe.runner.run_probe`` with a ``Policy`` (``output_layer`` in BF16 like the
  reference head), the ``te`` backend, BF16 parameters; diagnostics ``on`` = as a study runs them
  (statistics every 10 steps and the last, sentinels only on the replay of a non-finite step),
  ``off`` = statistics at the first and last step only, ``sentinels`` = ``on`` plus the non-finite
  sentinels on every step (what the probe did before; the ``diag``/``sent`` columns are their costs).

Step time: gap between the (CUDA-synchronised) ends of consecutive steps, median over the steps
after ``--warmup-steps``. Peak: ``max_memory_allocated`` after a reset; all freed between runs.

    python benchmarks/bench_stack.py --layers 32 --steps 12 --diagnostics both
    python benchmarks/bench_stack.py --layers 4 --rows bf16 fp8_delayed --json /tmp/stack.json
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import Fp8Format, LayerRecipe, Precision
from precsearch.probe.data import TokenBatches
from precsearch.probe.measure.diagnostics import DiagnosticsConfig
from precsearch.probe.model.llama3 import PRESETS, ModelConfig
from precsearch.probe.runner import run_probe
from precsearch.runtime.evaluate import te_version

P = Precision
#: Row -> (attention precision, MLP precision); equal ones make a uniform row.
ROWS = {
    "bf16": (P.BF16, P.BF16),
    "fp8_delayed": (P.FP8_DELAYED, P.FP8_DELAYED),
    "fp8_current": (P.FP8_CURRENT, P.FP8_CURRENT),
    "fp8_block": (P.FP8_BLOCK, P.FP8_BLOCK),
    "attn_current+mlp_delayed": (P.FP8_CURRENT, P.FP8_DELAYED),
    "attn_bf16+mlp_delayed": (P.BF16, P.FP8_DELAYED),
}
#: Unit names and their Hugging Face aliases, so the rules match either naming of the probe.
ATTN, MLP, HEAD = ("*.self_attention.*", "*.self_attn.*"), ("*.mlp.*",), ("output_layer", "lm_head")
#: ``on``: as a study runs (statistics every 10 steps and at the last, sentinels on a replayed bad step);
#: ``off``: statistics only at the first and last step; ``sentinels``: ``on`` plus sentinels on every step.
DIAGNOSTICS = {"on": DiagnosticsConfig(), "off": DiagnosticsConfig(every=10**9),
               "sentinels": DiagnosticsConfig(sentinels="every_step")}
DIAGNOSTIC_SETS = {"on": ("on",), "off": ("off",), "both": ("on", "off"), "all": ("on", "off", "sentinels")}
SPEED_TARGET, MEMORY_TOLERANCE, DELAYED_SPEEDUP_TARGET = 0.97, 0.02, 1.28
LR, BETAS, WEIGHT_DECAY, CLIP, SEED = 1e-4, (0.9, 0.95), 0.1, 1.0, 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("layers", 32), ("dim", 4096), ("ffn", 14336), ("heads", 32), ("kv-heads", 8),
                          ("vocab", 128256), ("seq", 4096), ("mb", 1), ("steps", 12), ("warmup-steps", 3)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    ap.add_argument("--diagnostics", choices=tuple(DIAGNOSTIC_SETS), default="on")
    ap.add_argument("--ref-adamw", choices=("fused", "foreach"), default="fused",
                    help="reference optimizer implementation (the probe uses torch's default, foreach)")
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/<date>_h200_bench_stack.json")
    args = ap.parse_args(argv)
    if not 1 <= args.warmup_steps < args.steps - 1:
        ap.error("need 1 <= --warmup-steps < --steps - 1 (at least two timed steps)")
    return args


def model_config(args: argparse.Namespace) -> ModelConfig:
    """The Llama 3 8B preset (RoPE scaling, eps, theta) resized to the CLI shape."""
    return PRESETS["llama3-8b"].with_overrides(
        n_layers=args.layers, dim=args.dim, ffn_dim=args.ffn, n_heads=args.heads, n_kv_heads=args.kv_heads,
        vocab_size=args.vocab, max_seq_len=max(args.seq, 8192))


def token_batches(args: argparse.Namespace) -> TokenBatches:
    """Uniform random token ids from a seeded generator; both stacks read ``train_batch(step)``."""
    n = (args.steps + 3) * args.mb * (args.seq + 1)
    tokens = torch.randint(0, args.vocab, (n,), generator=torch.Generator().manual_seed(SEED))
    return TokenBatches(tokens, seq_len=args.seq, micro_batch=args.mb, seed=SEED, eval_batches=1)


def policy_for(row: str) -> Policy:
    attn, mlp = ROWS[row]
    head = Rule(name="head", modules=HEAD, precision=P.BF16)
    if attn is mlp:
        return Policy(rules=(head,), default=attn, clip_grad=CLIP)
    rules = (head, Rule(name="attention", modules=ATTN, precision=attn), Rule(name="mlp", modules=MLP, precision=mlp))
    return Policy(rules=rules, default=P.BF16, clip_grad=CLIP)


def te_recipe(precision: Precision) -> Any:
    """The TE recipe for a uniform FP8 row, with precsearch's ``LayerRecipe`` defaults (so both stacks agree)."""
    from transformer_engine.common import recipe as r

    d = LayerRecipe()
    fmt = r.Format.HYBRID if d.fp8_format is Fp8Format.HYBRID else r.Format.E4M3
    if precision is P.FP8_DELAYED:
        return r.DelayedScaling(fp8_format=fmt, amax_history_len=d.amax_history_len,
                                amax_compute_algo=d.amax_compute_algo.value, margin=d.margin)
    if precision is P.FP8_CURRENT:
        return r.Float8CurrentScaling(fp8_format=fmt)
    if precision is P.FP8_BLOCK:
        return r.Float8BlockScaling(fp8_format=fmt)
    raise ValueError(f"no TE recipe for {precision.value}")


class Reference(nn.Module):
    """A plain Llama 3 on TE modules, written independently of precsearch's model."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        import transformer_engine.pytorch as te

        init = partial(nn.init.normal_, mean=0.0, std=0.02)
        kw = dict(dtype=torch.bfloat16, device="cuda")
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim, **kw)
        self.rope = te.RotaryPositionEmbedding(cfg.head_dim, rotary_base=cfg.rope_theta)
        self.layers = nn.ModuleList(te.TransformerLayer(
            cfg.dim, cfg.ffn_dim, cfg.n_heads, num_gqa_groups=cfg.n_kv_heads, layernorm_epsilon=cfg.norm_eps,
            hidden_dropout=0.0, attention_dropout=0.0, init_method=init, output_layer_init_method=init,
            layer_number=i + 1, self_attn_mask_type="causal", params_dtype=torch.bfloat16, fuse_qkv_params=True,
            bias=False, activation="swiglu", normalization="RMSNorm", device="cuda", attn_input_format="bshd",
        ) for i in range(cfg.n_layers))
        self.norm = te.RMSNorm(cfg.dim, eps=cfg.norm_eps, params_dtype=torch.bfloat16, device="cuda")
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, **kw)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x, freqs = self.embed(ids), self.rope(ids.shape[1])  # freqs: float32 [s, 1, 1, head_dim] angles
        for layer in self.layers:
            x = layer(x, rotary_pos_emb=freqs)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class StepClock:
    """Synchronised timestamps at the end of each step; step time = gap between consecutive ends."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.losses: list[float] = []

    def tick(self, _step: int = 0, loss: float = math.nan, _grad: float = math.nan) -> None:
        torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        self.losses.append(float(loss))

    def tokens_per_s(self, tokens: int, warmup: int) -> float:
        gaps = [b - a for a, b in zip(self.ends, self.ends[1:])][warmup - 1:]  # gap i is step i + 1
        return tokens / statistics.median(gaps) if gaps else 0.0


def free_gpu() -> None:
    """Drop every tensor of the previous run, TE's global FP8 buffers included, and reset the peak."""
    torch.empty(0, device="cuda")  # a CUDA context must exist before the peak can be reset
    gc.collect()
    try:
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager

        FP8GlobalStateManager.reset()
    except ImportError:
        pass
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def run_reference(cfg: ModelConfig, args: argparse.Namespace, data: TokenBatches, precision: Precision) -> dict:
    """Train the reference stack ``args.steps`` steps under one uniform precision."""
    import transformer_engine.pytorch as te

    free_gpu()
    torch.manual_seed(SEED)
    model, clock = Reference(cfg), StepClock()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY,
                            fused=args.ref_adamw == "fused", foreach=args.ref_adamw == "foreach")
    fp8 = precision.is_fp8
    recipe = te_recipe(precision) if fp8 else None
    for step in range(args.steps):
        ids, targets = (t.cuda(non_blocking=True) for t in data.train_batch(step))
        with te.autocast(enabled=fp8, recipe=recipe):
            loss = model(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.tick(step, loss.item())
    peak = torch.cuda.max_memory_allocated()
    del model, opt
    return {"tokens_per_s": clock.tokens_per_s(args.mb * args.seq, args.warmup_steps),
            "peak_gib": peak / 2**30, "first_loss": clock.losses[0], "last_loss": clock.losses[-1]}


def run_probe_row(cfg: ModelConfig, args: argparse.Namespace, data: TokenBatches, row: str, diag: str) -> dict:
    """The probe exactly as a study trial runs it (``run_probe``), timed the same way as the reference."""
    free_gpu()
    probe = ProbeSection(steps=args.steps, micro_batch=args.mb, seq_len=args.seq, lr=LR, lr_warmup_steps=1,
                         betas=BETAS, weight_decay=WEIGHT_DECAY, param_dtype="bf16", seed=SEED, device="cuda")
    clock = StepClock()
    r = run_probe(cfg, probe, policy_for(row), data, get_backend("te", torch.device("cuda")),
                  torch.device("cuda"), on_step=clock.tick, diagnostics=DIAGNOSTICS[diag])
    return {"tokens_per_s": clock.tokens_per_s(args.mb * args.seq, args.warmup_steps),
            "runner_tokens_per_s": r.tokens_per_s, "peak_gib": r.peak_memory_bytes / 2**30,
            "first_loss": r.losses[0], "last_loss": r.losses[-1], "diverged": r.diverged,
            "reason": r.reason, "layer_stats_rows": len(r.layer_stats)}


def guarded(fn, *a) -> dict:
    try:
        return fn(*a)
    except torch.OutOfMemoryError:
        return {"error": "out of memory", "tokens_per_s": 0.0, "peak_gib": math.nan}
    except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}", "tokens_per_s": 0.0, "peak_gib": math.nan}


def measure(cfg: ModelConfig, args: argparse.Namespace, data: TokenBatches) -> list[dict]:
    """Run every asked row (plus the BF16 baseline) on both stacks."""
    unsupported = get_backend("te", torch.device("cuda")).supported_precisions(torch.device("cuda"))
    diags = DIAGNOSTIC_SETS[args.diagnostics]
    rows, refs = [], {}
    for name in dict.fromkeys(["bf16", *args.rows]):
        attn, mlp = ROWS[name]
        reason = next((unsupported.get(p) for p in (attn, mlp) if unsupported.get(p)), None)
        if reason:
            rows.append({"row": name, "skipped": reason})
            continue
        ref_p = attn if attn is mlp else P.BF16
        if ref_p not in refs:
            refs[ref_p] = guarded(run_reference, cfg, args, data, ref_p)
        row = {"row": name, "uniform": attn is mlp, "reference_row": ref_p.value, "reference": refs[ref_p],
               "probe": {d: guarded(run_probe_row, cfg, args, data, name, d) for d in diags}}
        print(f"  {name}: ref {row['reference']['tokens_per_s']:.0f} tok/s, probe "
              + ", ".join(f"{d} {v['tokens_per_s']:.0f} tok/s" for d, v in row["probe"].items()), file=sys.stderr)
        rows.append(row)
    free_gpu()
    return compare([r for r in rows if r["row"] in args.rows or r["row"] == "bf16"])


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and not math.isnan(a) else math.nan


def compare(rows: list[dict]) -> list[dict]:
    """Ratios probe/reference, FP8 speed-ups against each stack's BF16 row, and PASS/FAIL checks."""
    base = next((r for r in rows if r["row"] == "bf16" and "skipped" not in r), None)
    for r in rows:
        if "skipped" in r or base is None:
            continue
        ref, probe = r["reference"], r["probe"].get("on") or r["probe"]["off"]
        r["speed_ratio"] = _ratio(probe["tokens_per_s"], ref["tokens_per_s"])
        r["memory_ratio"] = _ratio(probe["peak_gib"], ref["peak_gib"])
        base_probe = base["probe"].get("on") or base["probe"]["off"]
        r["ref_speedup"] = _ratio(ref["tokens_per_s"], base["reference"]["tokens_per_s"])
        r["probe_speedup"] = _ratio(probe["tokens_per_s"], base_probe["tokens_per_s"])
        if {"on", "off"} <= r["probe"].keys():
            r["diagnostics_overhead"] = 1 - _ratio(r["probe"]["on"]["tokens_per_s"], r["probe"]["off"]["tokens_per_s"])
        if {"sentinels", "off"} <= r["probe"].keys():
            r["every_step_sentinels_overhead"] = 1 - _ratio(r["probe"]["sentinels"]["tokens_per_s"],
                                                            r["probe"]["off"]["tokens_per_s"])
        checks = {}
        if r["uniform"]:  # a mixed row's reference is the BF16 stack: no like-for-like target
            checks["speed"] = r["speed_ratio"] >= SPEED_TARGET
            checks["memory"] = abs(r["memory_ratio"] - 1) <= MEMORY_TOLERANCE
        if r["row"] == "fp8_delayed":
            checks["probe_speedup"] = r["probe_speedup"] >= DELAYED_SPEEDUP_TARGET
            checks["ref_speedup"] = r["ref_speedup"] >= DELAYED_SPEEDUP_TARGET
        r["checks"] = {k: "PASS" if v else "FAIL" for k, v in checks.items()}
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'row':26s} {'ref tok/s':>10} {'probe tok/s':>11} {'ratio':>6} {'>=0.97':>6} {'ref GiB':>8} "
            f"{'probe GiB':>9} {'ratio':>6} {'+-2%':>5} {'ref x':>6} {'probe x':>7} {'>=1.28':>6} {'diag':>6} {'sent':>6}")
    lines = [head]
    for r in rows:
        if "skipped" in r or "speed_ratio" not in r:
            lines.append(f"{r['row']:26s} skipped: {r.get('skipped', 'no BF16 baseline')}")
            continue
        ref, probe, c = r["reference"], r["probe"].get("on") or r["probe"]["off"], r["checks"]
        delayed = "/".join(c[k] for k in ("probe_speedup", "ref_speedup") if k in c) or "-"
        overhead = f"{100 * r['diagnostics_overhead']:+.1f}%" if "diagnostics_overhead" in r else "-"
        sentinels = (f"{100 * r['every_step_sentinels_overhead']:+.1f}%"
                     if "every_step_sentinels_overhead" in r else "-")
        lines.append(
            f"{r['row']:26s} {ref['tokens_per_s']:10.0f} {probe['tokens_per_s']:11.0f} {r['speed_ratio']:6.3f} "
            f"{c.get('speed', 'n/a'):>6} {ref['peak_gib']:8.2f} {probe['peak_gib']:9.2f} {r['memory_ratio']:6.3f} "
            f"{c.get('memory', 'n/a'):>5} {r['ref_speedup']:6.2f} {r['probe_speedup']:7.2f} {delayed:>6} {overhead:>6} {sentinels:>6}")
    errors = [f"{r['row']} {side}: {v['error']}" for r in rows if "skipped" not in r
              for side, v in [("reference", r["reference"]), *r["probe"].items()] if "error" in v]
    return "\n".join(lines + errors)


def meta(cfg: ModelConfig, args: argparse.Namespace) -> dict:
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformer_engine": te_version(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "shape": {**vars(cfg), "rope_scaling": str(cfg.rope_scaling), "seq": args.seq, "mb": args.mb},
            "steps": args.steps, "warmup_steps": args.warmup_steps, "diagnostics": args.diagnostics,
            "ref_adamw": args.ref_adamw, "lr": LR, "clip_grad": CLIP,
            "targets": {"speed_ratio": SPEED_TARGET, "memory_tolerance": MEMORY_TOLERANCE,
                        "fp8_delayed_speedup": DELAYED_SPEEDUP_TARGET}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_stack needs a CUDA GPU with Transformer Engine", file=sys.stderr)
        return 2
    cfg, data = model_config(args), token_batches(args)
    rows = measure(cfg, args, data)
    print(f"\n{cfg.n_layers} layers, dim {cfg.dim}, ffn {cfg.ffn_dim}, heads {cfg.n_heads}/{cfg.n_kv_heads}, "
          f"seq {args.seq}, mb {args.mb}, {args.steps} steps ({args.warmup_steps} untimed), diagnostics "
          f"{args.diagnostics}; ratio = probe / reference; x = FP8 speed-up over the stack's BF16 row")
    print(table(rows))
    path = args.json or Path("benchmarks/results") / f"{datetime.date.today().isoformat()}_h200_bench_stack.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta(cfg, args), "rows": rows}, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
