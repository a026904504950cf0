"""A few trials of a space whose probes span several GPUs (``probe.nproc`` > 1: FSDP2, tensor parallelism).

Runs a BF16 reference, then a handful of precision policies, each as one
distributed probe (:func:`precsearch.probe.parallel.distributed.run_distributed_probe`),
and reports per GPU the measured peak memory (and the memory model's per-rank
prediction beside it), tokens/s over both GPUs, and the loss gap against the
BF16 reference (relative difference of the held-out loss). Prints a table and
writes JSON after every probe, so a run cut short keeps what it finished.

    python3 scripts/gpu_fsdp_trials.py search_spaces/llama3_70b_h200x2.yaml --json $OUT/fsdp_trials.json

``--layouts`` runs each policy under several ways of spanning the GPUs, side by side in one run:
``fsdp`` (``probe.tp: 1``), ``tp`` (``probe.tp: nproc`` with sequence parallelism) and ``tp-nosp``;
``--policies`` picks among :data:`POLICIES` (``attention/mlp``). Each layout's loss gap is against its
own BF16 reference, and the first row of each layout after the first also gives its first-loss
difference from the first layout's (the same weights and batch, split differently).

Budget: ``--budget-s`` stops starting new probes once the next one (estimated
from the slowest so far) would not end in time.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import torch

from precsearch.config.loader import load_space
from precsearch.probe.parallel.distributed import run_distributed_probe
from precsearch.search.sampling import policy_from_params

#: (attention, mlp) precisions tried after the BF16 reference; Hopper recipes only.
POLICIES = (
    ("bf16", "bf16"),
    ("fp8_delayed", "fp8_delayed"),
    ("fp8_current", "fp8_current"),
    ("fp8_block", "fp8_block"),
    ("fp8_delayed", "fp8_block"),
)
GIB = 2**30
#: probe overrides of each layout (tp: None means "all of nproc").
LAYOUTS = {"fsdp": {"tp": 1}, "tp": {"tp": None, "sequence_parallel": True},
           "tp-nosp": {"tp": None, "sequence_parallel": False}}


def _row(name: str, result, reference) -> dict:
    gap = (result.eval_loss - reference.eval_loss) / reference.eval_loss if reference else 0.0
    return {
        "policy": name, "eval_loss": result.eval_loss, "loss_gap": gap, "diverged": result.diverged,
        "reason": result.reason, "tokens_per_s": result.tokens_per_s, "memory_source": result.memory_source,
        "per_gpu_peak_gib": [b / GIB for b in result.per_rank_peak_bytes],
        "predicted_per_gpu_gib": result.predicted_memory.get("total", 0) / GIB,
        "predicted": result.predicted_memory, "wall_s": result.wall_s, "phase_s": result.phase_s,
        "losses": result.losses, "grad_norms": result.grad_norms,
    }


def _print(row: dict) -> None:
    peaks = " / ".join(f"{p:6.2f}" for p in row["per_gpu_peak_gib"])
    print(f"{row.get('layout', ''):<8} {row['policy']:<28} peak/GPU GiB {peaks} (predicted {row['predicted_per_gpu_gib']:6.2f})  "
          f"tokens/s {row['tokens_per_s']:9.0f}  eval {row['eval_loss']:.4f}  gap {100 * row['loss_gap']:+.3f}%"
          f"  wall {row['wall_s']:.0f}s{'  DIVERGED: ' + row['reason'] if row['diverged'] else ''}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=380.0, help="start no probe that would end after this")
    ap.add_argument("--steps", type=int, help="override probe.steps")
    ap.add_argument("--layouts", default="fsdp", help=f"comma-separated, of {', '.join(LAYOUTS)}")
    ap.add_argument("--policies", help="comma-separated attention/mlp pairs (default: all of POLICIES)")
    args = ap.parse_args(argv)
    layouts = args.layouts.split(",")
    if unknown := [x for x in layouts if x not in LAYOUTS]:
        ap.error(f"--layouts: unknown {unknown}; valid: {', '.join(LAYOUTS)}")
    policies = POLICIES if not args.policies else [tuple(p.split("/")) for p in args.policies.split(",")]
    if unknown := [p for p in policies if p not in POLICIES]:
        ap.error(f"--policies: unknown {unknown}; valid: {', '.join('/'.join(p) for p in POLICIES)}")
    # a SIGTERM (timeout, a killed call) unwinds like Ctrl-C, so the running probe's ranks are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    start = time.monotonic()
    space = load_space(args.space)
    probe = space.probe if args.steps is None else space.probe.model_copy(update={"steps": args.steps})
    cfg = space.model.probe()
    header = {"space": str(args.space), "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
              "torch": torch.__version__, "nproc": probe.nproc, "layers": cfg.n_layers, "dim": cfg.dim,
              "seq_len": probe.seq_len, "global_batch": probe.micro_batch, "steps": probe.steps,
              "params": cfg.num_params(), "rows": []}
    print(json.dumps({k: v for k, v in header.items() if k != "rows"}), flush=True)
    slowest, first_losses = 0.0, {}
    for layout in layouts:
        reference = None
        update = {k: (probe.nproc if v is None else v) for k, v in LAYOUTS[layout].items()}
        laid = probe.model_copy(update=update)
        for attention, mlp in policies:
            left = args.budget_s - (time.monotonic() - start)
            if slowest and left < 1.2 * slowest:
                print(f"stopping: {left:.0f} s left, the slowest probe took {slowest:.0f} s", flush=True)
                args.json.write_text(json.dumps(header, indent=1))
                return 0
            name = "BF16 reference" if attention == mlp == "bf16" else f"attn {attention}, mlp {mlp}"
            policy = policy_from_params(space, {"precision.attention": attention, "precision.mlp": mlp,
                                                "warmup_steps": 0})
            t0 = time.monotonic()
            try:
                result = run_distributed_probe(space, laid, policy, f"{layout}: {name}", timeout=max(30.0, left),
                                               on_step=lambda s, loss, g: print(f"  step {s} loss {loss:.4f}",
                                                                                flush=True))
            except Exception as exc:  # one failed policy is a finding, not the end of the run
                print(f"{layout}: {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
                header["rows"].append({"layout": layout, "policy": name, "error": f"{type(exc).__name__}: {exc}"})
                continue
            finally:
                slowest = max(slowest, time.monotonic() - t0)
            reference = reference or result
            row = _row(name, result, reference) | {"layout": layout, "device": result.device}
            first = first_losses.setdefault(name, result.losses[0])
            row["first_loss_vs_first_layout"] = (result.losses[0] - first) / first
            header["rows"].append(row)
            _print(row)
            args.json.write_text(json.dumps(header, indent=1))
    args.json.write_text(json.dumps(header, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
