"""Does a probe started from a trained checkpoint predict a long run better than one started from random init?

In one process: pretrain a small Llama 3 in BF16 on the probe's data (the stdlib byte stream), save it
as a Hugging Face checkpoint (``config.json`` + ``model.safetensors``, BF16), then run a handful of fixed
precision policies three ways:

* **random**: short probes of ``--probe-layers`` blocks from a seeded random init (what every study did);
* **checkpoint**: the same short probes, started from the checkpoint (``model.init_from``, blocks picked
  by ``--pick``);
* **long** (the truth): the full checkpoint model continued for ``--long-steps`` under each policy.

Each policy's loss gap is read against the BF16 run of the same start and seed, and against the BF16
seed spread (two seeds: the noise floor). Which start predicts the long run: the Spearman rank
correlation of the short gaps with the long gaps, and how many noise-unit verdicts (stable: gap <= 2
noise floors) agree. Per-layer signals: the FP8 input amax of each block at the last step (from the
probe's diagnostics) and the block-output kurtosis (its early-warning signals), short vs long.

    python scripts/gpu_checkpoint_compare.py --json $OUT/checkpoint_compare.json      # H200 sizes
    python scripts/gpu_checkpoint_compare.py --cpu-smoke --json /tmp/cc.json          # a 2-minute CPU check

Runs that would not end before ``--deadline-s`` are skipped and listed as such; the JSON is rewritten
after every run, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from precsearch.arch.config import ModelConfig
from precsearch.arch.hf_checkpoint import CheckpointStart, LayerPick, hf_config, pick_layers, read_config
from precsearch.backends import get_backend, resolve_device
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import AmaxAlgo, Fp8Format, LayerRecipe, Precision
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.model.hf_weights import to_hf
from precsearch.probe.model.llama3 import build_model
from precsearch.probe.runner import run_probe
from precsearch.probe.measure.signals import Signals

BLOCKS = ("decoder.layers.*",)
NOISE_LIMIT = 2.0


def policies(clip: float) -> dict[str, Policy]:
    """The fixed policies compared: FP8 recipes over the blocks, one with the output layer too, one risky."""
    def blocks(precision: Precision, **recipe) -> Policy:
        return Policy(rules=(Rule("blocks", BLOCKS, precision),), recipe=LayerRecipe(**recipe), clip_grad=clip)

    return {
        "bf16": Policy.bf16(clip),
        "fp8_delayed": blocks(Precision.FP8_DELAYED),
        "fp8_current": blocks(Precision.FP8_CURRENT),
        "fp8_block": blocks(Precision.FP8_BLOCK),
        "fp8_delayed_recent16": blocks(Precision.FP8_DELAYED, amax_history_len=16,
                                       amax_compute_algo=AmaxAlgo.MOST_RECENT),
        "fp8_current_e4m3": blocks(Precision.FP8_CURRENT, fp8_format=Fp8Format.E4M3),
        "fp8_current_all": Policy(default=Precision.FP8_CURRENT, clip_grad=clip),  # output layer too
    }


@dataclass
class Sizes:
    """The pretrained model's shape, its BF16 pretraining, and the short/long probes cut from it."""

    dim: int = 1024
    layers: int = 8
    heads: int = 16
    kv_heads: int = 4
    ffn: int = 3584
    seq_len: int = 512
    pretrain_batch: int = 32
    pretrain_steps: int = 2500
    pretrain_lr: float = 2e-3
    pretrain_seconds: float = 100.0
    probe_batch: int = 8
    probe_layers: int = 4
    short_steps: int = 120
    long_steps: int = 500
    probe_lr: float = 1e-3
    tokens: int = 8 * 2**20


CPU_SMOKE = Sizes(dim=64, layers=4, heads=4, kv_heads=2, ffn=128, seq_len=32, pretrain_batch=8, pretrain_steps=60,
                  pretrain_lr=3e-3, pretrain_seconds=60, probe_batch=4, probe_layers=2, short_steps=8,
                  long_steps=16, probe_lr=1e-3, tokens=300_000)


def pretrain(cfg: ModelConfig, data: TokenBatches, s: Sizes, device: torch.device, out: Path) -> dict:
    """Train ``cfg`` in BF16 autocast (fp32 master weights, AdamW, cosine LR) and save it as an HF checkpoint."""
    model = build_model(cfg, seed=1234, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=s.pretrain_lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    warm = max(1, s.pretrain_steps // 30)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / warm) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, k / s.pretrain_steps)))))
    start, losses, step = time.perf_counter(), [], 0
    for step in range(s.pretrain_steps):
        inputs, targets = (t.to(device, non_blocking=True) for t in data.train_batch(step))
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == s.pretrain_steps - 1:
            losses.append((step, loss.item()))
            print(f"  pretrain step {step}: loss {losses[-1][1]:.4f} ({time.perf_counter() - start:.0f} s)",
                  file=sys.stderr, flush=True)
            if time.perf_counter() - start > s.pretrain_seconds:
                break
    eval_loss = _eval(model, data, device)
    state = {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items()}
    _save_hf(cfg, state, out)
    return {"steps": step + 1, "seconds": time.perf_counter() - start, "losses": losses, "eval_loss": eval_loss,
            "checkpoint": str(out)}


def _eval(model: torch.nn.Module, data: TokenBatches, device: torch.device) -> float:
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        losses = [model(x.to(device), y.to(device)).item() for x, y in data.eval_set()]
    return sum(losses) / len(losses)


def _save_hf(cfg: ModelConfig, state: dict[str, torch.Tensor], out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(to_hf(cfg, state), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(cfg) | {"torch_dtype": "bfloat16"}, indent=1))


def _summary(result, cfg_layers: tuple[int, ...]) -> dict:
    """Loss, events and per-block signals of one probe; blocks named by their checkpoint index."""
    last = max((r["step"] for r in result.layer_stats), default=None)
    amax: dict[str, float] = {}
    for r in result.layer_stats:
        if r["step"] == last and r["role"] == "input" and r["layer"].startswith("decoder.layers."):
            block = cfg_layers[int(r["layer"].split(".")[2])]
            amax[str(block)] = max(amax.get(str(block), 0.0), float(r["amax"]))
    sig = Signals.from_dict(result.signals) if result.signals else Signals()
    return {"eval_loss": result.eval_loss, "diverged": result.diverged, "first_loss": result.losses[0],
            "final_train_loss": result.losses[-1], "input_amax_by_block": amax, "kurtosis": sig.kurtosis,
            "kurtosis_block": cfg_layers[sig.kurtosis_block] if sig.kurtosis_block >= 0 else -1,
            "amax_growth": sig.amax_growth, "alignment": sig.alignment, "attention_logit": sig.attention_logit,
            "wall_s": result.wall_s}


def _spearman(x: list[float], y: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        """Ranks from 0, ties sharing their mean rank (else equal gaps would rank by list order)."""
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        start = 0
        while start < len(order):
            end = start
            while end + 1 < len(order) and v[order[end + 1]] == v[order[start]]:
                end += 1
            for k in range(start, end + 1):
                r[order[k]] = (start + end) / 2
            start = end + 1
        return r

    if len(x) < 3:
        return math.nan
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else math.nan


def analyse(runs: dict) -> dict:
    """Gaps, noise floors and verdicts per start; how well each short start predicts the long run."""
    table: dict[str, dict] = {}
    for start, byname in runs.items():
        ref, other = byname.get("bf16@0"), byname.get("bf16@1")
        if ref is None:
            continue
        noise = abs(ref["eval_loss"] - other["eval_loss"]) / ref["eval_loss"] if other else math.nan
        rows = {}
        for name, r in byname.items():
            if name.startswith("bf16@"):
                continue
            gap = (r["eval_loss"] - ref["eval_loss"]) / ref["eval_loss"] if not r["diverged"] else math.inf
            rows[name] = {"gap": gap, "gap_in_noise": gap / noise if noise else math.nan,
                          "stable": bool(gap <= NOISE_LIMIT * noise) if noise == noise else None}
        table[start] = {"noise_floor": noise, "bf16_eval_loss": ref["eval_loss"], "policies": rows}
    verdicts = {}
    long = table.get("long", {}).get("policies", {})
    for start in ("random", "checkpoint"):
        short = table.get(start, {}).get("policies", {})
        names = [n for n in short if n in long and math.isfinite(short[n]["gap"]) and math.isfinite(long[n]["gap"])]
        agree = sum(short[n]["stable"] == long[n]["stable"] for n in short if n in long)
        verdicts[start] = {"spearman_vs_long": _spearman([short[n]["gap"] for n in names],
                                                         [long[n]["gap"] for n in names]),
                           "verdicts_agreeing": agree, "policies_compared": sum(n in long for n in short),
                           "mean_abs_gap_error": (sum(abs(short[n]["gap"] - long[n]["gap"]) for n in names)
                                                  / len(names)) if names else math.nan}
    return {"table": table, "prediction": verdicts, "signals": _signal_error(runs)}


def _signal_error(runs: dict) -> dict:
    """Per start: mean |ln(short / long)| of the per-block FP8 input amax, and the kurtosis short vs long."""
    out = {}
    long = runs.get("long", {})
    for start in ("random", "checkpoint"):
        errors, kurt = [], {}
        for name, r in runs.get(start, {}).items():
            truth = long.get(name)
            if truth is None:
                continue
            for block, value in r["input_amax_by_block"].items():
                ref = truth["input_amax_by_block"].get(block)
                if ref and value:
                    errors.append(abs(math.log(value / ref)))
            kurt[name] = {"short": r["kurtosis"], "long": truth["kurtosis"]}
        out[start] = {"amax_log_error": sum(errors) / len(errors) if errors else math.nan, "n": len(errors),
                      "kurtosis": kurt}
    return out


def main() -> None:
    """Pretrain, save as a HF checkpoint, run the short probes (random / checkpoint start) and the long runs,
    write the JSON and the table."""
    args = _args()
    s = CPU_SMOKE if args.cpu_smoke else Sizes()
    if args.probe_layers is not None:
        s = Sizes(**(asdict(s) | {"probe_layers": args.probe_layers}))
    t0 = time.perf_counter()
    device = resolve_device("cpu" if args.cpu_smoke else "auto")
    backend = get_backend("emulated" if device.type == "cpu" else "te", device)
    full = ModelConfig(vocab_size=256, dim=s.dim, n_layers=s.layers, n_heads=s.heads, n_kv_heads=s.kv_heads,
                       ffn_dim=s.ffn, max_seq_len=max(2048, s.seq_len))
    tokens = load_tokens("stdlib", max_tokens=s.tokens)
    pre_data = TokenBatches(tokens, seq_len=s.seq_len, micro_batch=s.pretrain_batch, seed=1234)
    data = TokenBatches(tokens, seq_len=s.seq_len, micro_batch=s.probe_batch, seed=0)
    assert pre_data.eval_start == data.eval_start, "pretraining must not see the probes' held-out tail"
    report: dict = {"sizes": asdict(s), "device": str(device), "backend": backend.name if hasattr(backend, "name")
                    else type(backend).__name__, "torch": torch.__version__, "pick": args.pick, "runs": {},
                    "skipped": []}
    save = (lambda: args.json.write_text(json.dumps(report, indent=1, default=str))) if args.json else (lambda: None)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    print(f"pretraining {full.num_params() / 1e6:.1f}M params on {device}", file=sys.stderr, flush=True)
    report["pretrain"] = pretrain(full, pre_data, s, device, args.checkpoint)
    save()
    assert read_config(args.checkpoint) == full, "the saved config.json must read back as the model trained"
    layers = pick_layers(s.layers, s.probe_layers, LayerPick(args.pick))
    report["probe_blocks"] = list(layers)
    probe_cfg = full.with_overrides(n_layers=s.probe_layers)
    short = ProbeSection(steps=s.short_steps, micro_batch=s.probe_batch, seq_len=s.seq_len, lr=s.probe_lr,
                         lr_warmup_steps=max(1, s.short_steps // 15), device=device.type)
    long = short.model_copy(update={"steps": s.long_steps})
    plan = []
    for name, policy in policies(1.0).items():
        seeds = (0, 1) if name == "bf16" else (0,)
        for seed in seeds:
            label = f"{name}@{seed}" if name == "bf16" else name
            plan.append(("random", label, policy, probe_cfg, short, seed, None, tuple(range(s.probe_layers))))
            plan.append(("checkpoint", label, policy, probe_cfg, short, seed,
                         CheckpointStart(args.checkpoint, layers), layers))
            plan.append(("long", label, policy, full, long, seed,
                         CheckpointStart(args.checkpoint, tuple(range(s.layers))), tuple(range(s.layers))))
    plan.sort(key=lambda p: p[0] == "long")  # every short probe first: they are the study being judged
    took: dict[str, float] = {}
    for start, label, policy, cfg, probe, seed, init, blocks in plan:
        left = args.deadline_s - (time.perf_counter() - t0)
        if took.get(start, 0.0) * 1.2 > left:
            report["skipped"].append(f"{start}/{label}")
            print(f"  skip {start}/{label}: {left:.0f} s left", file=sys.stderr, flush=True)
            continue
        began = time.perf_counter()
        result = run_probe(cfg, probe.model_copy(update={"seed": seed}), policy, data, backend, device, init=init)
        took[start] = max(took.get(start, 0.0), time.perf_counter() - began)
        report["runs"].setdefault(start, {})[label] = _summary(result, blocks)
        r = report["runs"][start][label]
        print(f"  {start:<10} {label:<22} eval {r['eval_loss']:.4f} first {r['first_loss']:.3f} "
              f"kurt {r['kurtosis']:.1f} ({took[start]:.0f} s)", file=sys.stderr, flush=True)
        report["analysis"] = analyse(report["runs"])
        save()
    report["wall_s"] = time.perf_counter() - t0
    save()
    _print(report)


def _print(report: dict) -> None:
    a, pre = report.get("analysis", {}), report["pretrain"]
    print(f"pretrained {pre['steps']} steps in {pre['seconds']:.0f} s: held-out loss {pre['eval_loss']:.4f}; "
          f"probe blocks {report['probe_blocks']} ({report['pick']})")
    table = a.get("table", {})
    for start in ("random", "checkpoint", "long"):
        t = table.get(start)
        if t:
            print(f"{start}: BF16 held-out loss {t['bf16_eval_loss']:.4f}, noise floor {100 * t['noise_floor']:.3f}%")
    names = list(table.get("long", table.get("random", {})).get("policies", {}))
    print(f"{'policy':<22} " + " ".join(f"{s + ' gap':>16} {'stable':>6}" for s in ("random", "checkpoint", "long")))
    for n in names:
        cells = []
        for start in ("random", "checkpoint", "long"):
            row = table.get(start, {}).get("policies", {}).get(n)
            cells.append(f"{100 * row['gap']:+15.3f}% {str(row['stable']):>6}" if row else f"{'-':>16} {'-':>6}")
        print(f"{n:<22} " + " ".join(cells))
    for start, p in a.get("prediction", {}).items():
        sig = a["signals"][start]
        print(f"{start} start vs long: Spearman {p['spearman_vs_long']:+.2f}, verdicts agreeing "
              f"{p['verdicts_agreeing']}/{p['policies_compared']}, mean |gap error| {100 * p['mean_abs_gap_error']:.3f}%, "
              f"per-block amax |ln ratio| {sig['amax_log_error']:.2f} over {sig['n']}")
    if report["skipped"]:
        print(f"skipped (deadline): {', '.join(report['skipped'])}")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=Path("/tmp/precsearch_ckpt"), help="where the HF checkpoint goes")
    p.add_argument("--pick", default="spread", choices=[x.value for x in LayerPick])
    p.add_argument("--probe-layers", type=int, default=None, help="blocks in the short probes (default: 4 of 8)")
    p.add_argument("--deadline-s", type=float, default=400.0, help="start no run that would end after this")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes, emulated FP8 on the CPU")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args()


if __name__ == "__main__":
    main()
