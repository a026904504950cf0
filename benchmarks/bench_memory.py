"""How well the memory model, calibrated on short probes, predicts full-depth peak memory.

For each policy (BF16; FP8 delayed, current and block scaling on every block
Linear; FP8 on the MLP only, on attention only; first/last block BF16; and the
memory knobs: BF16 AdamW moments, FP32 master weights, FP8 weight storage):

1. trains the policy's probe at a few shallow depths (default 2 and 4 blocks)
   for a few steps and reads each peak (``torch.cuda.max_memory_allocated``);
2. fits the memory model's residual from them (:mod:`precsearch.probe.memory.calibration`)
   and predicts the peak at the target's depth;
3. trains the target itself for a few steps and measures its peak.

Prints a table (policy, predicted, measured, error) and writes JSON. Every
policy runs at the same width, sequence length and micro-batch; a policy whose
predicted peak would not fit the GPU runs at the deepest of ``--fallback-layers``
that fits, and its row says so. Memory still held before a run (by earlier
runs in this process) is subtracted from its peak and reported.

    python benchmarks/bench_memory.py --gpu 0 --out $OUT            # Llama-3-8B shape, one H200, < 8 min
    python benchmarks/bench_memory.py --smoke --out /tmp/bm          # CPU: the code path only, figures predicted
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.memory.calibration import DepthMeasurement, fit_calibration, predict_target
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.model.llama3 import PRESETS, ModelConfig
from precsearch.probe.runner import backend_precisions, run_probe
from precsearch.runtime.evaluate import te_version

BLOCKS = "decoder.layers.*"
GIB = 2**30
#: A policy runs at the target depth only if its predicted peak leaves this fraction of the GPU free.
HEADROOM = 0.04


def policies() -> dict[str, Policy]:
    """The policies compared: precision assignments, then memory knobs."""
    def blocks(p: Precision, modules: tuple[str, ...] = (BLOCKS,)) -> tuple[Rule, ...]:
        return (Rule("fp8", modules, p),)

    current = blocks(Precision.FP8_CURRENT)
    return {
        "BF16": Policy(),
        "fp8_delayed, every block Linear": Policy(rules=blocks(Precision.FP8_DELAYED)),
        "fp8_current, every block Linear": Policy(rules=current),
        "fp8_block, every block Linear": Policy(rules=blocks(Precision.FP8_BLOCK)),
        "fp8_current, MLP only": Policy(rules=blocks(Precision.FP8_CURRENT, ("*.mlp.*",))),
        "fp8_current, attention only": Policy(rules=blocks(Precision.FP8_CURRENT, ("*.self_attn.*",))),
        "fp8_current, first/last block BF16": Policy(rules=(Rule("edges", ("*",), Precision.BF16, first=1, last=1),
                                                            *current)),
        "BF16, BF16 moments (FusedAdam)": Policy(memory=MemoryKnobs(moment_dtype="bf16")),
        "fp8_current, FP32 master + BF16 moments": Policy(
            rules=current, memory=MemoryKnobs(master_weights=True, moment_dtype="bf16")),
        "BF16, FP32 master + FP32 moments": Policy(memory=MemoryKnobs(master_weights=True, moment_dtype="fp32")),
        "fp8_current, FP8 weights": Policy(rules=current, memory=MemoryKnobs(fp8_weights=True)),
    }


def _fresh(device: torch.device) -> int:
    """Free what earlier runs left; the bytes still allocated (subtracted from the next peak)."""
    gc.collect()
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return int(torch.cuda.memory_allocated(device))


def _peak(cfg: ModelConfig, probe: ProbeSection, policy: Policy, data, backend, device) -> tuple[int, int]:
    """(peak bytes of one probe net of what was already allocated, the bytes already allocated)."""
    held = _fresh(device)
    result = run_probe(cfg, probe, policy, data, backend, device)
    return result.peak_memory_bytes - held, held


def _depth_for(policy: Policy, target: ModelConfig, depths: list[int], probe: ProbeSection, capacity: int) -> int:
    """The deepest of ``depths`` whose predicted peak fits ``capacity`` with headroom (the smallest if none)."""
    for n in sorted(depths, reverse=True):
        cfg = target.with_overrides(n_layers=n)
        need = predict_peak(cfg, backend_precisions(policy, cfg), seq_len=probe.seq_len, micro_batch=probe.micro_batch,
                            param_dtype=probe.param_dtype, memory=policy.memory).total
        if need <= (1 - HEADROOM) * capacity:
            return n
    return min(depths)


def bench_policy(name: str, policy: Policy, target: ModelConfig, probe: ProbeSection, calib_layers: list[int],
                 data, backend, device) -> dict:
    """Calibrate on the shallow probes, predict the target, measure it: one table row."""
    t0 = time.perf_counter()
    points, held = [], []
    for n in calib_layers:
        cfg = target.with_overrides(n_layers=n)
        predicted = predict_peak(cfg, backend_precisions(policy, cfg), seq_len=probe.seq_len,
                                 micro_batch=probe.micro_batch, param_dtype=probe.param_dtype, memory=policy.memory)
        measured, left = _peak(cfg, probe, policy, data, backend, device)
        points.append(DepthMeasurement(n, predicted.total, measured))
        held.append(left)
    calibration = fit_calibration(points)
    prediction = predict_target(target, backend_precisions(policy, target), calibration, seq_len=probe.seq_len,
                                micro_batch=probe.micro_batch, param_dtype=probe.param_dtype, memory=policy.memory)
    row = {"policy": name, "detail": policy.to_dict(), "target_layers": target.n_layers,
           "uncalibrated_gib": prediction.breakdown.total / GIB, "predicted_gib": prediction.bytes / GIB,
           "source": prediction.source if device.type == "cuda" else "predicted (no GPU: nothing measured)",
           "calibration": calibration.to_dict(), "breakdown": prediction.breakdown.to_dict(),
           "calibration_points": [vars(p) for p in points]}
    try:
        measured, left = _peak(target, probe, policy, data, backend, device)
    except torch.OutOfMemoryError:
        measured, left = math.nan, math.nan
    held.append(left)
    row |= {"measured_gib": measured / GIB, "held_before_gib": max(held) / GIB,
            "error_pct": 100 * (prediction.bytes / measured - 1) if measured == measured else math.nan,
            "uncalibrated_error_pct": 100 * (prediction.breakdown.total / measured - 1) if measured == measured
            else math.nan, "seconds": time.perf_counter() - t0}
    print(f"  {name}: predicted {row['predicted_gib']:.2f} GiB, measured {row['measured_gib']:.2f} GiB "
          f"({row['error_pct']:+.2f}%), {row['seconds']:.0f} s", file=sys.stderr, flush=True)
    return row


def format_table(rows: list[dict]) -> str:
    lines = [f"{'policy':42s} {'layers':>6} {'uncal GiB':>9} {'pred GiB':>9} {'meas GiB':>9} {'error':>8} "
             f"{'uncal err':>9}"]
    for r in rows:
        lines.append(f"{r['policy']:42s} {r['target_layers']:6d} {r['uncalibrated_gib']:9.2f} "
                     f"{r['predicted_gib']:9.2f} {r['measured_gib']:9.2f} {r['error_pct']:+7.2f}% "
                     f"{r['uncalibrated_error_pct']:+8.2f}%")
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] == r["error_pct"]]
    if errors:
        lines.append(f"max |error| {max(errors):.2f}% over {len(errors)} policies "
                     f"({sum(e <= 5 for e in errors)} within 5%)")
    return "\n".join(lines)


def _setup(args) -> tuple[ModelConfig, ProbeSection, torch.device, list[int]]:
    if args.smoke:
        target = PRESETS["tiny"]
        probe = ProbeSection(steps=2, micro_batch=2, seq_len=64, lr_warmup_steps=0, param_dtype="bf16", device="cpu")
        return target, probe, torch.device("cpu"), [1, 2]
    if not torch.cuda.is_available():
        raise SystemExit("bench_memory measures GPU memory: run it on a GPU, or with --smoke on CPU")
    torch.cuda.set_device(args.gpu)
    target = PRESETS[args.preset]
    probe = ProbeSection(steps=args.steps, micro_batch=args.micro_batch, seq_len=args.seq_len, lr=1e-4,
                         lr_warmup_steps=0, param_dtype="bf16", device="cuda")
    return target, probe, torch.device("cuda", args.gpu), args.calib_layers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b", choices=sorted(PRESETS))
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="steps per run (the peak is reached at the second)")
    ap.add_argument("--calib-layers", type=int, nargs="+", default=[2, 4], help="depths of the calibrating probes")
    ap.add_argument("--fallback-layers", type=int, nargs="+", default=[24, 16],
                    help="shallower targets for policies whose predicted peak does not fit the GPU")
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device index (or set CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--only", nargs="+", help="run only the policies whose names contain one of these")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting policies after this long")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU: checks the code path, measures nothing")
    args = ap.parse_args(argv)

    start = time.perf_counter()
    target, probe, device, calib = _setup(args)
    backend = get_backend("emulated" if args.smoke else "te", device)
    vocab = target.vocab_size
    data = TokenBatches(load_tokens("stdlib", max_tokens=2**20, vocab_size=vocab), seq_len=probe.seq_len,
                        micro_batch=probe.micro_batch, seed=0, eval_batches=1)
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 2**62
    chosen = {k: p for k, p in policies().items() if (not args.only or any(s in k for s in args.only))
              and not (args.smoke and not p.memory.is_default)}  # memory knobs need TE on a GPU
    rows, skipped = [], []
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.date.today().isoformat()}_bench_memory{'_smoke' if args.smoke else ''}.json"
    for name, policy in chosen.items():
        if time.perf_counter() - start > args.budget_s:
            skipped.append(name)
            continue
        depths = [target.n_layers, *(n for n in args.fallback_layers if n < target.n_layers)]
        depth = _depth_for(policy, target, depths, probe, capacity)
        rows.append(bench_policy(name, policy, target.with_overrides(n_layers=depth), probe, calib, data,
                                 backend, device))
        path.write_text(json.dumps({"meta": _meta(target, probe, device, calib, start, skipped), "rows": rows},
                                   indent=1, default=str))
    print(f"\nshape: width {target.dim}, seq {probe.seq_len}, micro-batch {probe.micro_batch}, BF16 params, "
          f"calibrated on {calib} blocks, {probe.steps} steps, backend {backend.name} on {device}")
    print(format_table(rows))
    if skipped:
        print(f"not run (over --budget-s {args.budget_s:.0f}): {', '.join(skipped)}")
    path.write_text(json.dumps({"meta": _meta(target, probe, device, calib, start, skipped), "rows": rows},
                               indent=1, default=str))
    print(f"wrote {path}")
    return 0


def _meta(target: ModelConfig, probe: ProbeSection, device: torch.device, calib: list[int], start: float,
          skipped: list[str]) -> dict:
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "transformer_engine": te_version(),
            "date": datetime.date.today().isoformat(),
            "target": target.__dict__ | {"rope_scaling": str(target.rope_scaling)},
            "probe": probe.model_dump(mode="json"), "calib_layers": calib, "skipped": skipped,
            "wall_s": time.perf_counter() - start}


if __name__ == "__main__":
    sys.exit(main())
