"""Profile one unit's compare step on a GPU: which kernels run (compiled Triton or eager ATen) and for how long.

    python scripts/profile_compare.py [--unit 112M] [--eager]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gram  # noqa: E402  (its unit inputs and step arguments)
from precsearch.probe.damage import compare  # noqa: E402
from precsearch.probe.damage.update import StepDtypes  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--unit", default="112M")
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    n = bench_gram._size(args.unit)
    gen = torch.Generator(device=device).manual_seed(0)
    g = [(1e-3 * torch.randn(n, generator=gen, device=device)).bfloat16() for _ in range(4)]
    p = [(gk.float() + 1e-5 * torch.randn(n, generator=gen, device=device)).bfloat16() for gk in g]
    w = 0.02 * torch.randn(n, generator=gen, device=device)
    m = (1e-4 * torch.randn(n, generator=gen, device=device), 1e-8 * torch.rand(n, generator=gen, device=device))
    dtypes = StepDtypes.of(bench_gram.KNOBS, "bf16")
    base = compare.baseline_grams(g, w, m, bench_gram.ARGS, device)

    def run():
        return compare.compare_unit(g, p, w, m, dtypes, bench_gram.ARGS, device, base=base,
                                    compile_compare=not args.eager)

    run(), run()
    torch.cuda.synchronize()
    print("compile failure:", compare.compile_failure())
    from torch._dynamo.utils import counters
    print("dynamo counters:", {k: dict(v) for k, v in counters.items() if v})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
