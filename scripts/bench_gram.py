"""The compare step's Gram product: one GEMM per block (the code) against segments in one batched GEMM.

The fixed-state reading adds ``X X^T`` of a K x n float64 block into a unit's Gram matrix, for every
``chunk``-element slice of every unit (:mod:`precsearch.probe.damage.compare`), as one GEMM with a K x K output
(:func:`precsearch.probe.damage.gram.gram_of_stacked`). ``segments`` (:func:`segmented`, written here) splits the
block into n / SEGMENT products of K x SEGMENT, one batched GEMM, summed: the guess was that cuBLAS gives a
K x K output with n in the millions to a few thread blocks. It does not: on an H100 (2026-12-06) one GEMM of an
8 x 2**24 block took 0.86 ms and the segments 0.90 ms, and a whole unit's compare step (112M elements) 17.5 ms
either way, so the code keeps one GEMM. Two parts, side by side in one run:

* ``gram``: the product alone, for K x n blocks the reading builds (K = 8: a policy's two families of 4 batches;
  16: the four families), n the compare chunk;
* ``unit``: the whole compare step of one unit (:func:`~precsearch.probe.damage.compare.compare_unit`, a policy
  with BF16 moments against the BF16 side's matrices, the state on the device), as it is and with
  :func:`segmented` patched in.

Each row: the median seconds over ``--repeats`` after one warm-up, the ratio of segments to one GEMM, and the
largest difference of the two matrices in units of sqrt(M_ii M_jj) (summation order only).

    python scripts/bench_gram.py --device cuda                     # on the GPU (seconds)
    python scripts/bench_gram.py --sizes 1M --unit 4M --repeats 3  # CPU: that it runs; CPU times are not the point
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_damage_compare import _size as size, _sync, gram_difference, unit_inputs, write  # noqa: E402
from precsearch.policy import MemoryKnobs  # noqa: E402
from precsearch.probe.damage import compare, gram  # noqa: E402
from precsearch.probe.damage.update import StepDtypes  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ARGS = (100, 3e-4, (0.9, 0.95), 0.1)  # step, lr, betas, weight decay
KNOBS = MemoryKnobs(master_weights=True, moment_dtype="bf16")  # the 8B space's kind


#: Columns of each product :func:`segmented` takes.
SEGMENT = 2**15


def segmented(x: torch.Tensor, out: torch.Tensor | None = None, segment: int = SEGMENT) -> torch.Tensor:
    """The block's float64 Gram matrix as n / ``segment`` products in one batched GEMM, summed, plus the rest."""
    xd = x.double()
    k, n = xd.shape
    whole = n - n % segment if n >= 2 * segment else 0
    result = out if out is not None else torch.zeros(k, k, dtype=torch.float64, device=xd.device)
    if whole:
        parts = xd[:, :whole].reshape(k, whole // segment, segment).transpose(0, 1)  # a view: no copy
        result.add_(torch.bmm(parts, parts.transpose(1, 2)).sum(0))
    rest = xd[:, whole:]
    return result.addmm_(rest, rest.T)


def _timed(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up (and the compiled compare's compile)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_gram(rows: int, n: int, repeats: int, device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(rows)
    x = (torch.randn(rows, n, generator=gen, device=device) + 0.1).double()
    acc = {name: torch.zeros(rows, rows, dtype=torch.float64, device=device) for name in ("one GEMM", "segments")}
    fns = {"one GEMM": lambda: gram.gram_of_stacked(x, acc["one GEMM"].zero_()),
           "segments": lambda: segmented(x, acc["segments"].zero_())}
    seconds = {name: _timed(fn, repeats, device) for name, fn in fns.items()}
    mirrored = {name: gram.symmetric(m.cpu()) for name, m in acc.items()}  # a block's product is not mirrored
    return {"part": "gram", "rows": rows, "elements": n, "seconds": seconds,
            "difference": gram_difference({"x": mirrored["segments"]}, {"x": mirrored["one GEMM"]})}


def bench_unit(n: int, k: int, repeats: int, device: torch.device, chunk: int, host_state: bool = False) -> dict:
    g, p, weight, moments = unit_inputs(n, k, device, torch.bfloat16, host_state)  # host: an 80 GB card's study
    dtypes = StepDtypes.of(KNOBS, "bf16")
    base = compare.baseline_grams(g, weight, moments, ARGS, device, chunk)
    out: dict[str, dict] = {}

    def run(name: str):
        out[name] = compare.compare_unit(g, p, weight, moments, dtypes, ARGS, device, chunk, base=base)

    seconds = {"one GEMM": _timed(lambda: run("one GEMM"), repeats, device)}
    with mock.patch.object(gram, "gram_of_stacked", segmented):
        seconds["segments"] = _timed(lambda: run("segments"), repeats, device)
    worst = gram_difference({key: out["segments"][key] for key in compare.POLICY},
                            {key: out["one GEMM"][key] for key in compare.POLICY})
    return {"part": "unit", "rows": 2 * k, "elements": n, "seconds": seconds, "difference": worst,
            "state": "host" if host_state and device.type == "cuda" else "device"}


def table(rows: list[dict]) -> str:
    lines = [f"{'part':13s} {'rows':>4} {'elements':>11} {'one GEMM s':>11} {'segments s':>11} {'ratio':>6} "
             f"{'difference':>10}"]
    for r in rows:
        s = r["seconds"]
        part = r["part"] + (f" ({r['state']})" if "state" in r else "")
        lines.append(f"{part:13s} {r['rows']:4d} {r['elements']:11d} {s['one GEMM']:11.5f} {s['segments']:11.5f} "
                     f"{s['segments'] / s['one GEMM']:6.3f} {r['difference']:10.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", nargs="+", default=["16M"], help="columns of the Gram-only blocks (the chunk)")
    ap.add_argument("--rows", nargs="+", type=int, default=[8, 16])
    ap.add_argument("--unit", default="112M", help="elements of the unit compared (112M: an 8B MLP projection)")
    ap.add_argument("--k", type=int, default=4, help="batches per state (the reading's default)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--host-state", action="store_true", help="the unit's state in page-locked host memory too")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    rows = [bench_gram(r, size(cols), args.repeats, device) for cols in args.sizes for r in args.rows]
    for host in (False, True) if args.host_state else (False,):
        rows.append(bench_unit(size(args.unit), args.k, args.repeats, device, compare.default_chunk(device), host))
    text = table(rows)
    print(text)
    meta = {"date": str(datetime.date.today()), "device": str(device), "torch": torch.__version__,
            "segment": SEGMENT, "chunk": compare.default_chunk(device), "repeats": args.repeats,
            "memory": KNOBS.changed(), "step_args": list(ARGS)}
    write(args.json or RESULTS / f"{datetime.date.today()}_{device.type}_bench_gram.json", meta, rows, text, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
