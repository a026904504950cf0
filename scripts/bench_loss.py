"""The probe's loss against ``F.cross_entropy(logits.float())``: bytes it allocates, time, agreement.

For each shape, in one process, the same BF16 logits and targets go through both losses, forward and
backward: ``precsearch.backends.cross_entropy.cross_entropy`` (one float32 copy, gradient in place)
and PyTorch's own ``F.cross_entropy`` on the float32 logits (the probe's loss until 2026-12-02, and the
reference here: it shares no code with the one under test). Reported per row:

* ``peak bytes / logit``: the most bytes held at once by the tensors the loss creates (counted with
  a dispatch mode, forward and backward; the logits themselves not counted). On a GPU also
  ``max_memory_allocated`` above the logits.
* ``time``: median wall time of forward + backward over ``--repeats`` (the two alternate).
* the loss's relative difference, and the largest gradient difference over the largest gradient (the
  BF16 gradients of the two may differ by a rounding step: 2^-8 to 2^-7 of a value).

    python scripts/bench_loss.py                           # CPU shapes
    python scripts/bench_loss.py --shapes 4096x128256      # the Llama-3-8B logits (5.9 GiB float32; GPU)
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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from precsearch.backends.cross_entropy import LOGIT_BYTES, cross_entropy  # noqa: E402
from precsearch.probe.memory.live_bytes import LiveBytes  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


LOSSES = {"precsearch": cross_entropy, "F.cross_entropy": reference}


def step(loss_fn, logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
    loss = loss_fn(logits, targets)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.item(), grad


def measure(tokens: int, vocab: int, repeats: int, device: torch.device) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(0)
    logits = (8 * torch.randn(tokens, vocab, generator=gen, device=device)).bfloat16().requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=gen, device=device)
    results, grads, times = {}, {}, {name: [] for name in LOSSES}
    for name, fn in LOSSES.items():
        with LiveBytes(logits, targets) as mode:
            value, grads[name] = step(fn, logits, targets)
        gpu_peak = None
        if device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step(fn, logits, targets)
            torch.cuda.synchronize()
            gpu_peak = torch.cuda.max_memory_allocated() - base
        results[name] = {"loss": value, "peak_bytes_per_logit": mode.peak / (tokens * vocab),
                         "gpu_peak_bytes_per_logit": gpu_peak / (tokens * vocab) if gpu_peak is not None else None}
    for _ in range(repeats):  # alternate, so a slower moment of the machine hits both
        for name, fn in LOSSES.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            step(fn, logits, targets)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    ours, theirs = grads["precsearch"].float(), grads["F.cross_entropy"].float()
    grad_diff = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    del grads, ours, theirs
    ref = results["F.cross_entropy"]
    rows = []
    for name in LOSSES:
        r = results[name]
        rows.append({"shape": f"{tokens}x{vocab}", "loss_fn": name, "loss": r["loss"],
                     "peak_bytes_per_logit": r["peak_bytes_per_logit"],
                     "gpu_peak_bytes_per_logit": r["gpu_peak_bytes_per_logit"],
                     "median_s": statistics.median(times[name]),
                     "time_vs_reference": statistics.median(times[name]) / statistics.median(times["F.cross_entropy"]),
                     "loss_rel_diff": abs(r["loss"] / ref["loss"] - 1), "max_grad_diff": grad_diff})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'shape':>14} {'loss':>16} {'bytes/logit':>11} {'GPU B/logit':>11} {'median ms':>9} "
             f"{'vs F.ce':>7} {'loss rel diff':>13} {'grad diff/max':>13}"]
    for r in rows:
        gpu = f"{r['gpu_peak_bytes_per_logit']:.2f}" if r["gpu_peak_bytes_per_logit"] is not None else "-"
        lines.append(f"{r['shape']:>14} {r['loss_fn']:>16} {r['peak_bytes_per_logit']:>11.2f} {gpu:>11} "
                     f"{1000 * r['median_s']:>9.1f} {r['time_vs_reference']:>6.2f}x {r['loss_rel_diff']:>13.1e} "
                     f"{r['max_grad_diff']:>13.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["512x32000", "1024x128256"],
                        help="TOKENSxVOCAB per row (default: two CPU-sized shapes)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, help="where to write the rows (default: scripts/results/DATE_DEVICE_bench_loss.json)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    for shape in args.shapes:
        tokens, _, vocab = shape.partition("x")
        rows += measure(int(tokens), int(vocab), args.repeats, device)
    text = table(rows)
    print(text)
    print(f"memory model: {LOGIT_BYTES} bytes per logit for the probe's loss")
    where = "h200" if device.type == "cuda" else "cpu"
    out = args.json or RESULTS / f"{datetime.date.today().isoformat()}_{where}_bench_loss.json"
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": args.repeats,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    out.with_suffix(".txt").write_text(text + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
