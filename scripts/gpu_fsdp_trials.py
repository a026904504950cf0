"""A few trials of a space whose probes span several GPUs (``probe.nproc`` > 1, FSDP2).

Runs a BF16 reference, then a handful of precision policies, each as one
distributed probe (:func:`precsearch.probe.distributed.run_distributed_probe`),
and reports per GPU the measured peak memory (and the memory model's per-rank
prediction beside it), tokens/s over both GPUs, and the loss gap against the
BF16 reference (relative difference of the held-out loss). Prints a table and
writes JSON after every probe, so a run cut short keeps what it finished.

    python3 scripts/gpu_fsdp_trials.py search_spaces/llama3_70b_h200x2.yaml --json $OUT/fsdp_trials.json

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
from precsearch.probe.distributed import run_distributed_probe
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
    print(f"{row['policy']:<28} peak/GPU GiB {peaks} (predicted {row['predicted_per_gpu_gib']:6.2f})  "
          f"tokens/s {row['tokens_per_s']:9.0f}  eval {row['eval_loss']:.4f}  gap {100 * row['loss_gap']:+.3f}%"
          f"  wall {row['wall_s']:.0f}s{'  DIVERGED: ' + row['reason'] if row['diverged'] else ''}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=380.0, help="start no probe that would end after this")
    ap.add_argument("--steps", type=int, help="override probe.steps")
    args = ap.parse_args(argv)
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
    reference, slowest = None, 0.0
    for attention, mlp in POLICIES:
        left = args.budget_s - (time.monotonic() - start)
        if slowest and left < 1.2 * slowest:
            print(f"stopping: {left:.0f} s left, the slowest probe took {slowest:.0f} s", flush=True)
            break
        name = "BF16 reference" if attention == mlp == "bf16" else f"attn {attention}, mlp {mlp}"
        policy = policy_from_params(space, {"precision.attention": attention, "precision.mlp": mlp,
                                            "warmup_steps": 0})
        t0 = time.monotonic()
        try:
            result = run_distributed_probe(space, probe, policy, name, timeout=max(30.0, left),
                                           on_step=lambda s, loss, g: print(f"  step {s} loss {loss:.4f}", flush=True))
        except Exception as exc:  # one failed policy is a finding, not the end of the run
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            header["rows"].append({"policy": name, "error": f"{type(exc).__name__}: {exc}"})
            if reference is None:
                break
            continue
        finally:
            slowest = max(slowest, time.monotonic() - t0)
        reference = reference or result
        header["rows"].append(_row(name, result, reference))
        _print(header["rows"][-1])
        args.json.write_text(json.dumps(header, indent=1))
    args.json.write_text(json.dumps(header, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
