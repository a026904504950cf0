"""Probe fidelity: does a short probe's verdict hold over a run ten times longer?

For each policy (FP8 recipes on every block Linear, on the MLP only, FP8
logits, and deliberately fragile ones: E4M3 gradients with a one-step amax
history, a 4x learning rate without LR warm-up or clipping; plus, as a
control, BF16 from another init seed), trains the same model on the same data
twice: a short probe (``--short`` steps) and a long run (``--long`` steps, >=
10x), each against a BF16 reference run with the same steps, learning rate,
warm-up and clipping. Reports per policy the held-out loss gap and the
stable/unstable call of each (stable: not diverged and gap <= ``--limit``),
Kendall's tau-b between the short and the long gaps (a diverged run ranks
worst), and how often the two calls agree. Prints a table and writes JSON.

The data is real text, pre-tokenized: the Python standard library's source as
bytes, written once to a ``.npy`` token file and read back through
``data.source: tokens``, as a user's corpus would be.

    python scripts/bench_fidelity.py --gpu 1 --out $OUT        # H200, 8 blocks x 1024 wide, < 8 min
    python scripts/bench_fidelity.py --smoke --out /tmp/bf     # CPU, tiny model, < 60 s
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import AmaxAlgo, Fp8Format, LayerRecipe, Precision
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.model import ModelConfig
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import run_probe
from precsearch.search.evaluate import front_policies, te_version

BLOCKS = "model.layers.*"


@dataclass(frozen=True)
class Case:
    """A policy and the probe settings it is stressed with (its BF16 reference shares them)."""

    policy: Policy
    lr_multiplier: float = 1.0
    lr_warmup: bool = True
    seed: int = 0

    def probe(self, base: ProbeSection, steps: int) -> ProbeSection:
        warmup = max(1, steps // 20) if self.lr_warmup else 0
        return base.model_copy(update={"steps": steps, "lr": base.lr * self.lr_multiplier,
                                       "lr_warmup_steps": warmup, "seed": self.seed})

    def reference_key(self) -> tuple:
        return (self.lr_multiplier, self.lr_warmup, self.policy.clip_grad)


def cases(clip: float | None) -> dict[str, Case]:
    """The policies compared, robust ones first, then fragile ones."""
    def rules(p: Precision, modules: tuple[str, ...] = (BLOCKS,)) -> tuple[Rule, ...]:
        return (Rule("fp8", modules, p),)

    fragile = LayerRecipe(fp8_format=Fp8Format.E4M3, amax_history_len=1, amax_compute_algo=AmaxAlgo.MOST_RECENT)
    return {
        "BF16, init seed 1 (control)": Case(Policy(clip_grad=clip), seed=1),
        "fp8_delayed, blocks": Case(Policy(rules=rules(Precision.FP8_DELAYED), clip_grad=clip)),
        "fp8_current, blocks": Case(Policy(rules=rules(Precision.FP8_CURRENT), clip_grad=clip)),
        "fp8_block, blocks": Case(Policy(rules=rules(Precision.FP8_BLOCK), clip_grad=clip)),
        "fp8_current, MLP only": Case(Policy(rules=rules(Precision.FP8_CURRENT, ("*.mlp.*",)), clip_grad=clip)),
        "fp8_delayed, every Linear incl. lm_head": Case(Policy(default=Precision.FP8_DELAYED, clip_grad=clip)),
        "fp8_delayed E4M3 grads, amax history 1": Case(Policy(default=Precision.FP8_DELAYED, recipe=fragile,
                                                              clip_grad=clip)),
        "fp8_delayed, 4x lr, no LR warm-up": Case(Policy(rules=rules(Precision.FP8_DELAYED), clip_grad=clip),
                                                  lr_multiplier=4.0, lr_warmup=False),
        "fp8_current incl. lm_head, 4x lr, no clip": Case(Policy(default=Precision.FP8_CURRENT), lr_multiplier=4.0),
    }


@dataclass
class Verdict:
    """One run read against its BF16 reference."""

    gap: float
    diverged: bool
    stable: bool
    eval_loss: float
    steps_run: int
    wall_s: float = 0.0
    reason: str = ""


def verdict(result, reference, limit: float) -> Verdict:
    diverged = result.diverged or not math.isfinite(result.eval_loss)
    gap = math.nan if diverged else result.eval_loss / reference.eval_loss - 1
    return Verdict(gap=gap, diverged=diverged, stable=not diverged and max(gap, 0.0) <= limit,
                   eval_loss=result.eval_loss, steps_run=len(result.losses), wall_s=result.wall_s,
                   reason=result.reason)


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b (ties in either ranking corrected); NaN when either ranking is all ties."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = _cmp(x[i], x[j]), _cmp(y[i], y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denom if denom else math.nan


def _cmp(a: float, b: float) -> int:
    return (a > b) - (a < b)


def _rank_value(v: Verdict) -> float:
    return math.inf if v.diverged else v.gap  # a diverged run is worse than any gap


def pretokenize(out: Path, n_tokens: int) -> Path:
    """The stdlib's source as byte tokens, saved as a uint16 ``.npy`` (the pre-tokenized corpus)."""
    path = out / "stdlib_bytes.npy"
    tokens = load_tokens("stdlib", max_tokens=n_tokens)
    np.save(path, tokens.numpy().astype(np.uint16))
    return path


def _settings(args) -> tuple[ModelConfig, ProbeSection, torch.device, str]:
    if args.smoke:
        cfg = ModelConfig(vocab_size=256, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=32)
        return cfg, ProbeSection(micro_batch=2, seq_len=32, lr=3e-3, device="cpu"), torch.device("cpu"), "emulated"
    if not torch.cuda.is_available():
        raise SystemExit("bench_fidelity runs on a GPU; use --smoke on CPU")
    torch.cuda.set_device(args.gpu)
    cfg = ModelConfig(vocab_size=256, dim=args.dim, n_layers=args.layers, n_heads=args.dim // 64,
                      n_kv_heads=max(1, args.dim // 256), ffn_dim=args.dim * 7 // 2, max_seq_len=args.seq_len)
    probe = ProbeSection(micro_batch=args.micro_batch, seq_len=args.seq_len, lr=args.lr, device="cuda")
    return cfg, probe, torch.device("cuda", args.gpu), "te"


def run(args) -> dict:
    start = time.perf_counter()
    cfg, base, device, backend_name = _settings(args)
    backend = get_backend(backend_name, device)
    args.out.mkdir(parents=True, exist_ok=True)
    corpus_dir = args.corpus_dir or Path(tempfile.mkdtemp(prefix="precsearch-corpus-"))
    corpus_dir.mkdir(parents=True, exist_ok=True)
    corpus = pretokenize(corpus_dir, args.tokens)
    tokens = load_tokens("tokens", path=corpus, vocab_size=cfg.vocab_size)
    data = TokenBatches(tokens, seq_len=base.seq_len, micro_batch=base.micro_batch, seed=0,
                        eval_batches=args.eval_batches)
    chosen = cases(args.clip)
    if args.study_dir:
        chosen |= {name: Case(p) for name, p in front_policies(args.study_dir, args.top).items()}
    if args.smoke:  # the control, one FP8 policy, one fragile one with its own reference
        chosen = dict(list(chosen.items())[:2] + list(chosen.items())[-1:])
    if args.only:  # split one comparison over several calls or GPUs (same settings), merged afterwards
        chosen = {k: v for k, v in chosen.items() if any(o in k for o in args.only)}
    references: dict[tuple, ProbeResult] = {}
    rows, calls = [], {"short": [], "long": []}
    for name, case in chosen.items():
        row = {"policy": name, "detail": case.policy.to_dict(), "lr_multiplier": case.lr_multiplier,
               "lr_warmup": case.lr_warmup, "seed": case.seed}
        for label, steps in (("short", args.short), ("long", args.long)):
            probe = case.probe(base, steps)
            key = (*case.reference_key(), steps)
            if key not in references:  # BF16, init seed 0, this case's steps, lr, warm-up and clipping
                references[key] = run_probe(cfg, replace(case, seed=0).probe(base, steps),
                                            Policy.bf16(case.policy.clip_grad), data, backend, device)
            result = run_probe(cfg, probe, case.policy, data, backend, device)
            calls[label].append(verdict(result, references[key], args.limit))
            row[label] = vars(calls[label][-1]) | {"reference_eval_loss": references[key].eval_loss}
        rows.append(row)
        if args.partial:
            args.partial.write_text(json.dumps({"rows": rows, "short_steps": args.short, "long_steps": args.long},
                                               indent=1, default=str))
        print(f"  {name}: short gap {row['short']['gap']:+.4f}, long gap {row['long']['gap']:+.4f} "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    short, long = calls["short"], calls["long"]
    summary = {"kendall_tau": kendall_tau([_rank_value(v) for v in short], [_rank_value(v) for v in long]),
               "agreement": sum(s.stable == lg.stable for s, lg in zip(short, long)) / len(rows),
               "n_policies": len(rows), "limit": args.limit}
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "transformer_engine": te_version(), "backend": backend_name,
            "date": datetime.date.today().isoformat(), "model": cfg.__dict__ | {"rope_scaling": str(cfg.rope_scaling)},
            "probe": base.model_dump(mode="json"), "short_steps": args.short, "long_steps": args.long,
            "corpus": {"path": str(corpus), "tokens": int(tokens.numel()), "source": "stdlib bytes, .npy"},
            "wall_s": time.perf_counter() - start}
    return {"meta": meta, "summary": summary, "rows": rows}


def format_table(report: dict) -> str:
    def cell(v: dict) -> str:
        gap = "diverged" if v["diverged"] else f"{100 * v['gap']:+7.3f}%"
        return f"{gap:>9} {'stable' if v['stable'] else 'UNSTABLE':>8}"

    lines = [f"{'policy':44s} {'short gap':>9} {'call':>8} {'long gap':>9} {'call':>8} agree"]
    for r in report["rows"]:
        lines.append(f"{r['policy']:44s} {cell(r['short'])} {cell(r['long'])} "
                     f"{'yes' if r['short']['stable'] == r['long']['stable'] else 'NO':>5}")
    s = report["summary"]
    lines.append(f"Kendall tau-b (short vs long gap): {s['kendall_tau']:+.3f}; stable/unstable agreement "
                 f"{100 * s['agreement']:.0f}% of {s['n_policies']} (limit {100 * s['limit']:.1f}%)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", type=int, default=60, help="steps of the short probe")
    ap.add_argument("--long", type=int, default=600, help="steps of the long run (>= 10x --short)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping of the non-fragile policies")
    ap.add_argument("--limit", type=float, default=0.01, help="stable if the loss gap is at most this")
    ap.add_argument("--tokens", type=int, default=8 * 2**20, help="bytes of stdlib source in the corpus")
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--corpus-dir", type=Path, help="where the .npy token file is written (default: a temp dir)")
    ap.add_argument("--study-dir", type=Path, help="add this finished study's front policies")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device index (or set CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "scripts/results")))
    ap.add_argument("--only", nargs="+", help="run only the policies whose name contains one of these")
    ap.add_argument("--partial", type=Path, help="rewrite this JSON with the rows so far after each policy")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU (emulated FP8): the code path, < 60 s")
    args = ap.parse_args(argv)
    if args.smoke:
        args.short, args.long, args.tokens, args.eval_batches = 2, 20, 2**16, 1
    if args.long < 10 * args.short:
        ap.error(f"--long ({args.long}) must be at least 10x --short ({args.short})")
    report = run(args)
    print(format_table(report))
    path = args.out / f"{report['meta']['date']}_bench_fidelity{'_smoke' if args.smoke else ''}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
