"""The fixed-state reading's compare step, one unit, before and after it streamed over chunks: time and bytes.

For each unit size, in one process, the same K batch gradients of both sides (BF16, as the 8B space's BF16
parameters give them), and the state's float32 weight and AdamW moments, go through:

* ``whole`` (the reference, written here on its own: the compare step as it was before 2026-12-02): every
  list whole (float32 copies of the gradients, errors, baseline updates, update errors), one AdamW update
  per batch through the stored moments and the kept weight, Gram matrices by pairwise float64 dot products;
* ``chunked``: :func:`precsearch.probe.damage.compare.compare_unit` (one pass over ``--chunk``-element slices,
  default the reading's for the device, K x chunk blocks, Gram matrices accumulated, one host sync; on CUDA the
  chunk's chain compiled, as the reading runs it);
* ``policy``: the same with the BF16 families' Gram matrices given (``base=``, from
  :func:`~precsearch.probe.damage.compare.baseline_grams`, computed once outside the timing): what a policy's
  reading pays per unit, since the reader computes those once per state for every policy;
* ``eager`` (CUDA only): ``chunked`` with ``compile_compare=False``, the op-by-op chain.

Reported per row: the median wall time over ``--repeats`` (the two alternate), the peak bytes held at once by
the tensors the step creates (on a CPU :class:`LiveBytes`, a dispatch mode: the inputs not counted; on a GPU
``max_memory_allocated`` above the inputs, since under the dispatch mode the compiled compare ran eager), and
the largest difference between the two's Gram matrices, in units of each entry's Cauchy-Schwarz bound
``sqrt(M_ii M_jj)`` (summation order only: ~1e-16).

    python benchmarks/bench_damage_compare.py                          # CPU: 1M, 4M, 16M elements, ~2-3 min
    python benchmarks/bench_damage_compare.py --sizes 1M --repeats 1   # a quick look
    python benchmarks/bench_damage_compare.py --device cuda --sizes 16M 64M 525M   # the 8B output layer
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_reference as ref  # noqa: E402  (the plain compare step, written apart from the code under test)
from precsearch.policy import MemoryKnobs  # noqa: E402
from precsearch.probe.damage.compare import baseline_grams, compare_unit, default_chunk  # noqa: E402
from precsearch.probe.damage.update import StepDtypes  # noqa: E402
from precsearch.probe.memory.live_bytes import LiveBytes  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

#: The memory knobs benched (parameters BF16, as the 8B space's): the 8B space's own kind (FP32 master, BF16
#: moments: one pass) and the costliest (FP16 master, FP8 moments: two amax passes before the Gram pass).
MEMORY = {
    "fp32 master, bf16 moments": MemoryKnobs(master_weights=True, moment_dtype="bf16"),
    "fp16 master, fp8 moments": MemoryKnobs(master_weights=True, master_dtype="fp16", moment_dtype="fp8"),
}
PARAM_DTYPE = "bf16"
ARGS = (100, 3e-4, (0.9, 0.95), 0.1)  # step, lr, betas, weight decay


def whole(g, p, weight, moments, knobs, device):
    """The compare step of one unit as it was: whole tensors, per-batch updates, pairwise float64 dots."""
    g = [t.float() for t in g]
    p = [t.float() for t in p]
    e = [pk - gk for pk, gk in zip(p, g)]
    w = weight.to(device, non_blocking=True)
    m = tuple(x.to(device, non_blocking=True) for x in moments)
    ref_updates = [ref.adam(w, gk, *m, *ARGS) for gk in g]
    err = [ref.applied(w, pk, m, *ARGS, knobs, PARAM_DTYPE) - rk for pk, rk in zip(p, ref_updates)]
    return {"g": ref.pairwise_gram(g), "e": ref.pairwise_gram(e), "u": ref.pairwise_gram(ref_updates),
            "ue": ref.pairwise_gram(err)}


def chunked(g, p, weight, moments, knobs, device, chunk, base=None, compile_compare=True):
    return compare_unit(g, p, weight, moments, StepDtypes.of(knobs, PARAM_DTYPE), ARGS, device, chunk, base=base,
                        compile_compare=compile_compare)


# ---- the bench --------------------------------------------------------------------------------------------------

def unit_inputs(n: int, k: int, device: torch.device, grad_dtype: torch.dtype, host_state: bool):
    """K gradients of each side on ``device``; the state's weight and moments (float32, pinned host memory when
    ``host_state`` and the device is a GPU, as ``keep_states: host`` keeps them)."""
    gen = torch.Generator(device=device).manual_seed(n)
    g = [(1e-3 * torch.randn(n, generator=gen, device=device)).to(grad_dtype) for _ in range(k)]
    p = [(gk.float() + 1e-5 * torch.randn(n, generator=gen, device=device)).to(grad_dtype) for gk in g]
    weight = 0.02 * torch.randn(n, generator=gen, device=device)
    moments = (1e-4 * torch.randn(n, generator=gen, device=device), 1e-8 * torch.rand(n, generator=gen, device=device))
    if host_state and device.type == "cuda":
        weight, moments = weight.cpu().pin_memory(), tuple(m.cpu().pin_memory() for m in moments)
    return g, p, weight, moments


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gram_difference(a: dict, b: dict) -> float:
    """The largest |a - b| over every Gram entry, in units of sqrt(M_ii M_jj) of ``b``."""
    worst = 0.0
    for key in b:
        d = b[key].diagonal().clamp(min=0).sqrt()
        bound = torch.outer(d, d).clamp(min=1e-300)
        worst = max(worst, float(((a[key] - b[key]).abs() / bound).max()))
    return worst


def measure(n: int, k: int, repeats: int, device: torch.device, chunk: int, grad_dtype: torch.dtype,
            host_state: bool) -> list[dict]:
    g, p, weight, moments = unit_inputs(n, k, device, grad_dtype, host_state)
    inputs = (*g, *p, weight, *moments)
    rows = []
    base = baseline_grams(g, weight, moments, ARGS, device, chunk)  # the same for every policy at the state
    for memory, knobs in MEMORY.items():
        fns = {"whole": lambda: whole(g, p, weight, moments, knobs, device),
               "chunked": lambda: chunked(g, p, weight, moments, knobs, device, chunk),
               "policy": lambda: chunked(g, p, weight, moments, knobs, device, chunk, base=base)}
        if device.type == "cuda":
            fns["eager"] = lambda: chunked(g, p, weight, moments, knobs, device, chunk, compile_compare=False)
        grams, peaks, gpu_peaks, times = {}, {}, {}, {name: [] for name in fns}
        for name, fn in fns.items():
            _sync(device)
            if device.type == "cuda":  # the allocator counts the bytes: under LiveBytes (a dispatch mode)
                torch.cuda.reset_peak_memory_stats(device)  # torch.compile ran the compare eager (H100, 2026-12-06)
                allocated = torch.cuda.memory_allocated(device)  # not `base`: the policy row's BF16 matrices
                grams[name] = fn()
                _sync(device)
                peaks[name] = gpu_peaks[name] = torch.cuda.max_memory_allocated(device) - allocated
                continue
            with LiveBytes(*inputs) as mode:
                grams[name] = fn()
            peaks[name], gpu_peaks[name] = mode.peak, None
        for _ in range(repeats):
            for name, fn in fns.items():
                _sync(device)
                t0 = time.perf_counter()
                fn()
                _sync(device)
                times[name].append(time.perf_counter() - t0)
        for name in fns:
            rows.append({
                "elements": n, "k": k, "memory": memory, "compare": name, "chunk": chunk if name == "chunked" else None,
                "seconds": statistics.median(times[name]), "seconds_all": times[name],
                "peak_bytes": peaks[name], "peak_bytes_per_element": peaks[name] / n,
                "max_allocated_bytes": gpu_peaks[name],
                "time_vs_whole": statistics.median(times[name]) / statistics.median(times["whole"]),
                "gram_difference": gram_difference(grams[name], grams["whole"]) if name != "whole" else 0.0,
            })
    return rows


def _size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def table(rows: list[dict]) -> str:
    head = (f"{'elements':>10} {'memory knobs':<26} {'compare':<8} {'median s':>9} {'vs whole':>8} "
            f"{'peak MiB':>9} {'B/elem':>7} {'gram diff':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['elements']:>10} {r['memory']:<26} {r['compare']:<8} {r['seconds']:>9.3f} "
                     f"{r['time_vs_whole']:>8.2f} {r['peak_bytes'] / 2**20:>9.1f} {r['peak_bytes_per_element']:>7.1f} "
                     f"{r['gram_difference']:>9.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1M", "4M", "16M"], help="unit sizes in elements (K/M/G)")
    ap.add_argument("--k", type=int, default=4, help="batches per state (objectives.damage.batches)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, help="the chunked compare's elements per chunk (default: the reading's "
                    "for the device, reading.default_chunk)")
    ap.add_argument("--grad-dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--device-state", action="store_true", help="on a GPU: state on the device, not pinned host")
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/<date>_<device>_bench_damage_compare.json")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    args.chunk = args.chunk or default_chunk(device)
    grad_dtype = torch.bfloat16 if args.grad_dtype == "bf16" else torch.float32
    rows = []
    for size in args.sizes:
        rows += measure(_size(size), args.k, args.repeats, device, args.chunk, grad_dtype, not args.device_state)
    text = table(rows)
    print(text)
    out = args.json or RESULTS / f"{datetime.date.today()}_{device.type}_bench_damage_compare.json"
    meta = {"date": str(datetime.date.today()), "device": str(device), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "k": args.k, "repeats": args.repeats, "chunk": args.chunk,
            "grad_dtype": args.grad_dtype, "param_dtype": PARAM_DTYPE, "step_args": list(ARGS),
            "state": "device" if args.device_state or device.type == "cpu" else "pinned host",
            "memory": {name: knobs.changed() for name, knobs in MEMORY.items()}}
    write(out, meta, rows, text, device)
    return 0


def write(out: Path, meta: dict, rows: list[dict], text: str, device: torch.device) -> None:
    """The bench's JSON (``meta`` with the GPU's name on one, ``rows``) at ``out`` and its table beside it."""
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".txt").write_text(text + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
