"""What an FP8 output layer costs in memory, by step phase, against the memory model (issue 31's FP8-head miss).

The per-module study of 2026-11-30 measured -33% memory saved for an FP8 output layer at the 8B width (2
blocks, BF16 parameters, vocabulary 128,256) where the model predicted -10%. This trains precsearch's probe
(``te`` backend, torch AdamW, BF16 parameters) at 2 and 4 blocks of the 8B width for a few steps under: BF16;
the output layer alone in FP8 (current, delayed, block scaling); the block Linears in FP8 current with the
head BF16 (the control the model gets right), and writes, per run, the measured peak and the peak and resident
bytes by phase (``ProbeResult.memory_phases``) beside the model's breakdown. GPU only.

    python scripts/fp8_head_memory.py --layers 2 4 --json /tmp/head.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.model.llama3 import PRESETS
from precsearch.probe.runner import run_probe

GIB = 2**30


def policies() -> dict[str, Policy]:
    """BF16, the head alone in each Hopper FP8 recipe, and the blocks in FP8 with the head BF16."""
    out = {"BF16": Policy()}
    for p in (Precision.FP8_CURRENT, Precision.FP8_DELAYED, Precision.FP8_BLOCK):
        out[f"head {p.value}"] = Policy(rules=(Rule("head", ("output_layer",), p),))
    out["blocks fp8_current"] = Policy(rules=(Rule("blocks", ("decoder.layers.*",), Precision.FP8_CURRENT),))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fp8_head_memory measures GPU memory: run it on a GPU")
    device = torch.device("cuda")
    backend = get_backend("te", device)
    probe = ProbeSection(steps=args.steps, micro_batch=1, seq_len=args.seq_len, lr=1e-4, lr_warmup_steps=0,
                         param_dtype="bf16", device="cuda")
    vocab = PRESETS["llama3-8b"].vocab_size
    data = TokenBatches(load_tokens("stdlib", max_tokens=2**20, vocab_size=vocab), seq_len=probe.seq_len,
                        micro_batch=1, seed=0, eval_batches=1)
    rows = []
    for layers in args.layers:
        cfg = PRESETS["llama3-8b"].with_overrides(n_layers=layers)
        for name, policy in policies().items():
            gc.collect()
            torch.cuda.empty_cache()
            r = run_probe(cfg, probe, policy, data, backend, device)
            row = {"layers": layers, "policy": name, "peak_gib": r.peak_memory_bytes / GIB,
                   "predicted_gib": r.predicted_memory["total"] / GIB,
                   "predicted": {k: v / GIB for k, v in r.predicted_memory.items()},
                   "phases": {kind: {k: v / GIB for k, v in part.items()}
                              for kind, part in r.memory_phases.items()},
                   "diverged": r.diverged}
            rows.append(row)
            print(f"{layers} blocks, {name}: peak {row['peak_gib']:.2f} GiB (model {row['predicted_gib']:.2f}); "
                  f"phase peaks {json.dumps({k: round(v, 2) for k, v in row['phases'].get('peak', {}).items()})}",
                  flush=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
