"""The front a precsearch study found, against the recipes people set by hand.

Evaluates in one run, on the probe shape (and, unless --skip-target, on the
full-depth target shape): BF16; FP8 on every Linear of the transformer blocks
(delayed, current, block scaling: Transformer Engine as a drop-in);
Megatron-style (current scaling, first and last block in BF16);
torchao-style (tensorwise current scaling, skipping the head and layers with a
dimension under --small); DeepSeek-V3-style (block scaling on the MLP,
attention projections and head in BF16); and every policy on the study's
Pareto front. Then checks, for each hand-set recipe, whether a front policy is
at least as good on every objective (memory saved, instability, tokens/s) and
strictly better on one. Prints tables and writes JSON.

    python scripts/bench_front.py search_spaces/llama3_8b_h100.yaml --study-dir precsearch-runs/llama3-8b-h100 \
        --json scripts/results/DATE_h200_bench_front.json

Hand-set rows clip gradients at 1.0 and keep the space's baseline optimizer
state (``objectives.baseline_memory``); front rows run exactly as the study
found them. Each row's loss gap is against the BF16 row with the same gradient
clipping (as the study pairs its references). On the target shape every row runs with BF16 parameters and torch
AdamW (``--precision-only`` semantics of bench_target.py) so that the 8B model
fits one GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from dataclasses import replace
from pathlib import Path

import torch

from precsearch.backends import get_backend, resolve_device
from precsearch.config.loader import load_space
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.memory.peak import linear_shapes
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.runtime.evaluate import evaluate_policies, format_rows, front_policies, te_version
from precsearch.search.pareto import dominates
from precsearch.search.scoring import DIRECTIONS as SCORE_DIRECTIONS
from precsearch.probe.data import load_batches

OBJECTIVES = ("memory_saved", "instability", "tokens_per_s")
DIRECTIONS = tuple(SCORE_DIRECTIONS[k] for k in OBJECTIVES)
BLOCKS = "model.layers.*"


def hand_set(cfg: ModelConfig, memory: MemoryKnobs, small: int) -> dict[str, Policy]:
    """The recipes people reach for, as policies."""
    base = Policy(clip_grad=1.0, memory=memory)
    every = {f"TE {p.value} on every block Linear": replace(base, rules=(Rule("blocks", (BLOCKS,), p),))
             for p in (Precision.FP8_DELAYED, Precision.FP8_CURRENT, Precision.FP8_BLOCK)}
    megatron = replace(base, rules=(Rule("edges", ("*",), Precision.BF16, first=1, last=1),
                                    Rule("blocks", (BLOCKS,), Precision.FP8_CURRENT)))
    small_layers = tuple(f"*.{suffix}" for suffix, (fan_in, fan_out) in linear_shapes(cfg).items()
                         if min(fan_in, fan_out) < small)
    torchao = replace(base, rules=(Rule("small", small_layers or ("-none-",), Precision.BF16),
                                   Rule("blocks", (BLOCKS,), Precision.FP8_CURRENT)))
    deepseek = replace(base, rules=(Rule("mlp", ("*.mlp.*",), Precision.FP8_BLOCK),))
    return every | {"Megatron-style: first/last block BF16": megatron,
                    f"torchao-style: skip head and dims < {small}": torchao,
                    "DeepSeek-V3-style: block-scaled MLP only": deepseek}


def verdicts(rows: list[dict], hand_names: list[str], front_names: list[str]) -> list[dict]:
    """For each hand-set row: the front rows that beat it (>= everywhere, > somewhere)."""
    by_name = {r["policy"]: r for r in rows}
    out = []
    for name in hand_names:
        point = [by_name[name][k] for k in OBJECTIVES]
        beaters = [f for f in front_names if dominates([by_name[f][k] for k in OBJECTIVES], point, DIRECTIONS)]
        out.append({"hand_set": name, "beaten_by": beaters, "met": bool(beaters)})
    return out


def _run_shape(label: str, cfg: ModelConfig, probe, policies: dict[str, Policy], data, backend, device,
               hand_names: list[str]) -> dict:
    print(f"\n{label}: {cfg.n_layers} layers, dim {cfg.dim}, seq {probe.seq_len}, micro-batch {probe.micro_batch}, "
          f"{probe.steps} steps, backend {backend.name} on {device}", file=sys.stderr, flush=True)
    rows = evaluate_policies(cfg, probe, policies, data, backend, device)
    front_names = [n for n in policies if n.startswith("front:")]
    result = {"shape": label, "rows": rows, "verdicts": verdicts(rows, hand_names, front_names)}
    print(f"\n== {label} ==\n{format_rows(rows)}")
    for v in result["verdicts"]:
        print(f"  {'MET ' if v['met'] else 'MISS'} {v['hand_set']}: "
              + (f"beaten by {', '.join(v['beaten_by'])}" if v["met"] else "no front policy beats it on all objectives"))
    return result



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path)
    ap.add_argument("--study-dir", type=Path, required=True, help="the finished study whose front is compared")
    ap.add_argument("--small", type=int, default=2048, help="torchao-style: skip Linears with a dimension below")
    ap.add_argument("--target-steps", type=int, default=10)
    ap.add_argument("--skip-target", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    space = load_space(args.space)
    device = resolve_device(space.probe.device)
    backend = get_backend(space.backend.value, device)
    cfg = space.model.probe()
    baseline = MemoryKnobs(**space.objectives.baseline_memory.model_dump())
    hand = hand_set(cfg, baseline, args.small)
    front = front_policies(args.study_dir)
    clips = {p.clip_grad for p in front.values()} - {1.0}
    policies = ({"BF16": Policy(clip_grad=1.0, memory=baseline)}
                | {f"BF16 (clip {c})": Policy(clip_grad=c, memory=baseline) for c in clips} | hand | front)
    data = load_batches(space)
    shapes = [_run_shape("probe", cfg, space.probe, policies, data, backend, device, list(hand))]
    if not args.skip_target:
        lean = {name: replace(p, memory=MemoryKnobs()) for name, p in policies.items()}
        steps = args.target_steps
        probe = space.probe.model_copy(update={"steps": steps, "lr_warmup_steps": min(2, steps - 1)})
        shapes.append(_run_shape("target", space.model.target(), probe, lean, data, backend, device, list(hand)))
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
                "torch": torch.__version__, "transformer_engine": te_version(),
                "date": datetime.date.today().isoformat(), "space": str(args.space), "study_dir": str(args.study_dir)}
        args.json.write_text(json.dumps({"meta": meta, "shapes": shapes}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
