"""What keeping the fixed-state reading's states in page-locked host memory costs, three ways, on one GPU.

A state of the shipped 8B space's probe (4 blocks at the Llama-3-8B width) is 17.6 GiB of FP32 tensors (every
weight, two moments per unit weight). The reader copies each state from the GPU into host memory once per
clipping value and back to the GPU at every reading. This script times, for ``--states`` such states made of the
probe's own tensor shapes:

* ``per-tensor``: ``torch.empty(..., pin_memory=True)`` per tensor (PyTorch's caching host allocator, which
  rounds each block up to a power of two), then the copy: what the reader did before;
* ``one block``: :class:`precsearch.utils.pinned.PinnedBlock`, what ``states._snapshot`` does: one FP32 host
  tensor of the state's exact size, its pages mapped by a parallel fill, page-locked with ``cudaHostRegister``,
  the state's tensors views into it;
* ``pageable``: plain host tensors (no page-locking);

each as: seconds to allocate, to copy GPU -> host, and to copy host -> GPU (what a reading pays), with the host
memory page-locked.

    python scripts/bench_pinned.py --json $OUT/bench_pinned.json          # on the GPU (~1 min)
    python scripts/bench_pinned.py --dim 256 --layers 2 --vocab 4096      # any small shape
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from precsearch.arch.units import unit_names, unit_shape
from precsearch.probe.model.llama3 import PRESETS
from precsearch.utils.pinned import PinnedBlock

GIB = 2**30


def state_shapes(cfg) -> list[tuple[int, ...]]:
    """The FP32 tensors of one state: every parameter of the probe, and two moments of each unit weight."""
    from precsearch.probe.model.llama3 import Llama3

    with torch.device("meta"):
        model = Llama3(cfg)
    shapes = [tuple(p.shape) for p in model.parameters()]
    return shapes + [unit_shape(cfg, u) for u in unit_names(cfg) for _ in range(2)]


def _sync() -> None:
    torch.cuda.synchronize()


def per_tensor(sources: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
    t0 = time.perf_counter()
    out = [torch.empty(s.shape, dtype=torch.float32, pin_memory=True) for s in sources]
    return out, time.perf_counter() - t0


def one_block(sources: list[torch.Tensor]) -> tuple[list[torch.Tensor], float, PinnedBlock]:
    t0 = time.perf_counter()
    block = PinnedBlock([s.shape for s in sources])
    out = [block.take(s.shape) for s in sources]
    return out, time.perf_counter() - t0, block


def pageable(sources: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
    t0 = time.perf_counter()
    out = [torch.empty(s.shape, dtype=torch.float32) for s in sources]
    return out, time.perf_counter() - t0


def copies(host: list[torch.Tensor], sources: list[torch.Tensor]) -> tuple[float, float]:
    _sync()
    t0 = time.perf_counter()
    for h, s in zip(host, sources):
        h.copy_(s)
    _sync()
    d2h = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = [h.to("cuda", non_blocking=True) for h in host]
    _sync()
    h2d = time.perf_counter() - t0
    del back
    return d2h, h2d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, help="override the 8B width (a small test shape)")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--states", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    over = {"n_layers": args.layers} | ({"dim": args.dim, "ffn_dim": 4 * args.dim} if args.dim else {}) | (
        {"vocab_size": args.vocab} if args.vocab else {})
    cfg = PRESETS["llama3-8b"].with_overrides(**over)
    shapes = state_shapes(cfg)
    sources = [torch.randn(s, device="cuda") for s in shapes]  # one state's tensors, reused for every state
    size = sum(s.numel() for s in sources) * 4
    rows = {}
    for name in ("per-tensor", "one block", "pageable"):
        alloc = d2h = h2d = 0.0
        kept = []
        for _ in range(args.states):
            if name == "per-tensor":
                host, a = per_tensor(sources)
            elif name == "one block":
                host, a, block = one_block(sources)
                kept.append(block)
            else:
                host, a = pageable(sources)
            d, h = copies(host, sources)
            alloc, d2h, h2d = alloc + a, d2h + d, h2d + h
            kept.append(host)
        rows[name] = {"alloc_s": alloc, "d2h_s": d2h, "h2d_s": h2d, "first_state_s": alloc + d2h}
        print(f"{name:11s} {args.states} x {size / GIB:.1f} GiB: allocate {alloc:6.2f} s, GPU->host {d2h:6.2f} s, "
              f"host->GPU (a reading) {h2d:6.2f} s", flush=True)
        del kept, host  # a PinnedBlock unregisters itself when freed
        torch._C._host_emptyCache()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "state_gib": size / GIB,
              "states": args.states, "shape": over, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
