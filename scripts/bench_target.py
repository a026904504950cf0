"""Check a study's front at full depth: BF16, FP8 on every Linear, and the best policies found.

For each policy, trains the *target* model of the space (all its layers, the
probe's sequence length and micro-batch) for a few steps on the space's
backend and device, and reports peak memory, tokens/s and the loss gap
against BF16, all from this one run. Prints a table and writes JSON.

    python scripts/bench_target.py search_spaces/llama3_8b_h100.yaml \
        --study-dir precsearch-runs/llama3-8b-h100 --top 3 --steps 20 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import replace
import json
import platform
import sys
from pathlib import Path

import torch

from precsearch.backends import get_backend, resolve_device
from precsearch.config.loader import load_space
from precsearch.policy import MemoryKnobs, Policy
from precsearch.precision import Precision
from precsearch.runtime.evaluate import evaluate_policies, format_rows, front_policies, te_version
from precsearch.probe.data import load_batches




def _uniform(precision: Precision, clip: float | None, memory: MemoryKnobs) -> Policy:
    return Policy(default=precision, clip_grad=clip, memory=memory)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path)
    ap.add_argument("--study-dir", type=Path, help="a finished study's output dir (adds its front)")
    ap.add_argument("--top", type=int, default=3, help="front policies to check, most memory saved first")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, help="override the target's depth (default: the preset's)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--precision-only", action="store_true",
                    help="run every policy with the default memory settings (BF16 params, torch AdamW): "
                         "compares precision assignments where the baseline's optimizer state would not fit")
    args = ap.parse_args(argv)

    space = load_space(args.space)
    target = space.model.target()
    if args.layers:
        target = target.with_overrides(n_layers=args.layers)
    probe = space.probe.model_copy(update={"steps": args.steps, "lr_warmup_steps": min(2, args.steps - 1)})
    device = resolve_device(probe.device)
    backend = get_backend(space.backend.value, device)
    clip = space.search.clip_grad.options()[0]
    baseline = MemoryKnobs() if args.precision_only else MemoryKnobs(**space.objectives.baseline_memory.model_dump())
    policies = {"BF16": _uniform(Precision.BF16, clip, baseline)}
    for p in (Precision.FP8_DELAYED, Precision.FP8_CURRENT, Precision.FP8_BLOCK):
        if backend.supported_precisions(device).get(p) is None:
            policies[f"{p.value} on every Linear"] = _uniform(p, clip, baseline)
    if args.study_dir:
        front = front_policies(args.study_dir, args.top)
        policies |= {k: replace(p, memory=baseline) if args.precision_only else p for k, p in front.items()}
    clips = {p.clip_grad for p in policies.values()} - {clip}
    policies |= {f"BF16 (clip {c})": _uniform(Precision.BF16, c, baseline) for c in clips}
    data = load_batches(space.model_copy(update={"probe": probe}))
    rows = evaluate_policies(target, probe, policies, data, backend, device)
    print(f"\ntarget: {target.n_layers} layers, dim {target.dim}, seq {probe.seq_len}, micro-batch "
          f"{probe.micro_batch}, {probe.steps} steps, backend {backend.name} on {device}")
    print(format_rows(rows))
    if args.json:
        meta = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
                "torch": torch.__version__, "transformer_engine": te_version(),
                "date": datetime.date.today().isoformat(), "target": target.__dict__ | {"rope_scaling": str(target.rope_scaling)},
                "probe": probe.model_dump(mode="json")}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
