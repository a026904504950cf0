"""A space's BF16 reference under candidate probe regimes: the regime check's verdict, signals, seed spread, step time.

For each regime (learning rate, LR warm-up, gradient accumulation) the BF16 reference probe of the space
runs at ``--seeds`` seeds, exactly as a study runs it (the space's model, data, steps, schedule, baseline
memory settings, ``--clip``); the regime check (:mod:`precsearch.probe.regime`) reads its events and
signals. One row per regime is printed and the whole report written as JSON (``--json``, else
``$OUT/regime.json`` when ``OUT`` is set, else ``scripts/results/<date>_regime.json``).

A regime is ``lr=3e-4,warmup=10,accum=4`` (and optionally ``seeds=2``); ``today`` is the space's own.
No regime starts whose projected time (from the step time measured so far, per token) would end past
``--budget-s``: it is listed as skipped.

    python scripts/gpu_regime.py search_spaces/llama3_8b_h100.yaml --seeds 3          # on the H200
    python scripts/gpu_regime.py search_spaces/quickstart.yaml --seeds 2 \\
        --set probe.steps=20 --set model.n_layers=2 --regime today --regime lr=1e-3,warmup=10,accum=2  # CPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import yaml

from precsearch.backends import get_backend, resolve_device
from precsearch.config.loader import parse_space
from precsearch.config.space import Space
from precsearch.policy import Policy
from precsearch.probe.data import TokenBatches, load_batches
from precsearch.probe.measure.events import count_events
from precsearch.probe.regime import check_regime
from precsearch.probe.runner import run_probe
from precsearch.search.scoring import measure_noise_floor
from precsearch.utils.yaml_io import load_yaml

#: Tried in this order (the space's own first, then what issue 28 asks for), until the budget runs out.
#: At the 8B space on one H200 (~0.4 s a step at 4,096 tokens) the first three take about 4 minutes.
DEFAULT_REGIMES = ("today", "lr=3e-4,warmup=10,accum=1", "lr=3e-4,warmup=10,accum=4,seeds=2",
                   "lr=3e-4,warmup=20,accum=1", "lr=1e-4,warmup=10,accum=1", "lr=3e-4,warmup=20,accum=8,seeds=2")
_KEYS = {"lr": ("lr", float), "warmup": ("lr_warmup_steps", int), "accum": ("grad_accum", int)}


def parse_regime(text: str, space: Space, seeds: int) -> tuple[dict, int]:
    """``lr=..,warmup=..,accum=..[,seeds=..]`` (or ``today``) as probe-section updates and a seed count."""
    updates = {"lr": space.probe.lr, "lr_warmup_steps": space.probe.lr_warmup_steps,
               "grad_accum": space.probe.grad_accum}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if item == "today":
            continue
        if key == "seeds":
            seeds = int(value)
        elif key in _KEYS:
            updates[_KEYS[key][0]] = _KEYS[key][1](value)
        else:
            sys.exit(f"regime {text!r}: unknown key {key!r}; valid: today, lr, warmup, accum, seeds")
    return updates, seeds


def run_regime(space: Space, updates: dict, seeds: int, clip: float | None, base: TokenBatches, ctx) -> dict:
    """The BF16 reference at ``seeds`` seeds under ``updates``, checked, as one report row."""
    probe = space.probe.model_copy(update=updates)
    data = TokenBatches(base.tokens, seq_len=probe.seq_len, micro_batch=probe.micro_batch, seed=probe.seed,
                        eval_batches=base.eval_batches, grad_accum=probe.grad_accum)
    policy = Policy.bf16(clip, space.baseline_knobs())
    results = []
    for i in range(seeds):
        seeded = probe.model_copy(update={"seed": probe.seed + i})
        print(f"  lr {probe.lr:g}, warm-up {probe.lr_warmup_steps}, grad_accum {probe.grad_accum}: seed "
              f"{seeded.seed}", file=sys.stderr, flush=True)
        results.append(run_probe(ctx["cfg"], seeded, policy, data, ctx["backend"], ctx["device"],
                                 target=space.model.target()))
    return _row(probe, results, clip)


def _row(probe, results, clip) -> dict:
    seeds = [probe.seed + i for i in range(len(results))]
    verdict = check_regime(results, seeds)
    tokens = probe.micro_batch * probe.seq_len * probe.grad_accum
    step_s = [tokens / r.tokens_per_s for r in results if r.tokens_per_s > 0]
    return {"lr": probe.lr, "lr_warmup_steps": probe.lr_warmup_steps, "grad_accum": probe.grad_accum,
            "tokens_per_step": tokens, "steps": probe.steps, "clip_grad": clip, "seeds": seeds,
            "smooth": verdict.smooth, "findings": [f.__dict__ for f in verdict.findings],
            "eval_losses": [r.eval_loss for r in results], "diverged": [r.diverged for r in results],
            "seed_spread": measure_noise_floor(results), "tail_seed_spread": measure_noise_floor(results, "tail"),
            "step_s": statistics.median(step_s) if step_s else math.nan,
            "wall_s": sum(r.wall_s for r in results),
            "peak_memory_bytes": max(r.peak_memory_bytes for r in results),
            "per_seed": [_seed_signals(r) for r in results]}


def _seed_signals(result) -> dict:
    """What the regime check reads, per seed: events, the attention-logit peak, the block-amax run."""
    signals = result.signals or {}
    series = signals.get("series", {})
    logits = [p for p in series.get("attention_logit", []) if math.isfinite(p[1])]
    amax = [p for p in series.get("block_amax", []) if math.isfinite(p[1])]
    return {"loss_spikes": count_events(result.events, "loss_spike"),
            "grad_blowups": count_events(result.events, "grad_blowup"),
            "max_attention_logit": max(logits, key=lambda p: p[1]) if logits else None,
            "amax_tensor": signals.get("block_amax_at", ""),
            "amax_first_peak": [amax[0][1], max(v for _, v in amax)] if amax else None,
            "losses": result.losses, "grad_norms": result.grad_norms}


def _print(rows: list[dict], skipped: list[str]) -> None:
    print(f"{'lr':>7} {'warm':>4} {'accum':>5} {'tok/step':>8} {'seeds':>5} {'verdict':>10} {'spread':>7} "
          f"{'tail spr.':>9} {'step s':>7} {'spikes':>6} {'blowups':>7} {'max logit (step)':>16} "
          f"{'amax first->peak':>17}")
    for r in rows:
        per = r["per_seed"]
        logit = max((s["max_attention_logit"] for s in per if s["max_attention_logit"]), key=lambda p: p[1],
                    default=None)
        amax = max((s["amax_first_peak"] for s in per if s["amax_first_peak"]), key=lambda p: p[1] / p[0],
                   default=None)
        print(f"{r['lr']:>7g} {r['lr_warmup_steps']:>4} {r['grad_accum']:>5} {r['tokens_per_step']:>8} "
              f"{len(r['seeds']):>5} {'smooth' if r['smooth'] else 'NOT SMOOTH':>10} {100 * r['seed_spread']:6.2f}% "
              f"{100 * r['tail_seed_spread']:8.2f}% {r['step_s']:7.3f} {sum(s['loss_spikes'] for s in per):>6} "
              f"{sum(s['grad_blowups'] for s in per):>7} "
              f"{f'{logit[1]:.4g} ({logit[0]})' if logit else '-':>16} "
              f"{f'{amax[0]:.3g} -> {amax[1]:.4g}' if amax else '-':>17}")
        for f in r["findings"]:
            print(f"        seed {f['seed']}: {f['evidence']}")
    for text in skipped:
        print(f"skipped (over --budget-s): {text}")


def _space(path: Path, sets: list[str]) -> Space:
    data = load_yaml(path)
    for item in sets:
        dotted, _, value = item.partition("=")
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = yaml.safe_load(value)
    return parse_space(data, file=str(path), base_dir=path.resolve().parent)


def main() -> None:
    args = _args()
    space = _space(args.space, args.set)
    device = resolve_device(space.probe.device)
    ctx = {"cfg": space.model.probe(), "device": device, "backend": get_backend(space.backend.value, device)}
    base, start = load_batches(space), time.perf_counter()
    report = {"space": str(args.space), "set": args.set, "device": str(device), "clip_grad": args.clip,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "rows": [], "skipped": []}
    out = args.json or _default_json()
    per_token_s = None  # measured wall seconds per trained token, from the regimes run so far
    for text in args.regime or DEFAULT_REGIMES:
        updates, seeds = parse_regime(text, space, args.seeds)
        tokens = seeds * space.probe.steps * space.probe.micro_batch * space.probe.seq_len * updates["grad_accum"]
        if per_token_s is not None and time.perf_counter() - start + per_token_s * tokens > args.budget_s:
            report["skipped"].append(text)
            continue
        report["rows"].append(run_regime(space, updates, seeds, args.clip, base, ctx))
        done = sum(len(r["seeds"]) * r["steps"] * r["tokens_per_step"] for r in report["rows"])
        per_token_s = (time.perf_counter() - start) / done
        _write(out, report, start)  # after every regime: a run killed by a timeout keeps what it measured
    _write(out, report, start)
    _print(report["rows"], report["skipped"])
    print(f"wrote {out} ({report['wall_s']:.0f} s)")


def _write(out: Path, report: dict, start: float) -> None:
    report["wall_s"] = time.perf_counter() - start
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))


def _default_json() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "regime.json"
    return Path(__file__).resolve().parent / "results" / f"{dt.date.today().isoformat()}_regime.json"


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("space", type=Path)
    p.add_argument("--seeds", type=int, default=3, help="BF16 reference seeds per regime (a regime's seeds= wins)")
    p.add_argument("--regime", action="append", default=[], help=f"repeatable; default: {', '.join(DEFAULT_REGIMES)}")
    p.add_argument("--set", action="append", default=[], help="override a space field, e.g. probe.steps=20")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping of the references (the space's default)")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="seconds (after start-up) past which no regime is projected to end; else it is skipped")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args()


if __name__ == "__main__":
    main()
