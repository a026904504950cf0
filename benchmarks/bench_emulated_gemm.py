"""The emulated GEMMs on BF16 codes against float32, side by side: time per training step and what changed.

precsearch's emulated backend (:mod:`precsearch.backends.emulated`) runs a GPU's GEMMs on each operand's codes in
BF16 with FP32 accumulation (``CODE_GEMMS = "cuda"``); before, it ran them in float32 on the dequantized values
(``"never"``, still the CPU's path). This bench trains the soak's emulated model (``bench_soak``: precsearch's
Llama3, 4 blocks of width 512, micro-batch 16 x 512, ``FP8StateAdamW``) for a few steps per recipe in each mode,
in one process, and reports ms per step, the speed-up, and the largest difference of the per-step training
losses between the modes (the same products, added in another order). The BF16 model (no emulated layer) is
the floor. With ``--compile``, a third column: the codes path with the scalers' quantize-dequantize functions
compiled by ``torch.compile`` (fused into a few kernels: on a GPU the passes over each operand, not the GEMMs,
are most of an emulated step), an experiment of this bench; the package does not compile them.

    python benchmarks/bench_emulated_gemm.py --json results/emulated_gemm.json          # a GPU
    python benchmarks/bench_emulated_gemm.py --smoke                                    # a CPU: the code path
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_soak  # noqa: E402

from precsearch.backends import emulated  # noqa: E402

RECIPES = ("fp8_delayed", "fp8_current", "fp8_block", "mxfp8", "nvfp4", "fp8_rowwise")
#: The pure tensor functions of ``precsearch.fp8.scaling`` that ``--compile`` replaces with compiled ones.
COMPILED = ("quantize_blocks", "quantize_dequantize", "block_amax", "nvfp4_quantize")


def compiled_quantizers(on: bool) -> None:
    """Swap ``precsearch.fp8.scaling``'s quantize functions for ``torch.compile``'d ones (``on``) or back."""
    from precsearch.fp8 import scaling

    originals = _ORIGINALS.setdefault("scaling", {name: getattr(scaling, name) for name in COMPILED})
    for limit in ("recompile_limit", "cache_size_limit"):  # one graph per operand shape and layout: more than 8
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    for name, fn in originals.items():
        setattr(scaling, name, torch.compile(fn, dynamic=False) if on else fn)


_ORIGINALS: dict[str, dict] = {}


def time_steps(recipe: str, mode: str, s: bench_soak.Setup, steps: int, warmup: int) -> dict:
    """Train ``warmup + steps`` steps of the emulated model in ``mode``; ms per timed step and each step's loss."""
    emulated.CODE_GEMMS = mode
    combo = bench_soak.Combo(recipe=recipe, model="emulated")
    device = "cpu" if s.smoke else "cuda"
    model, opt = bench_soak.build(combo, s, seed=0)
    data = bench_soak.stdlib_bytes()
    losses = []
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            began = time.perf_counter()
        loss = bench_soak.forward(model, *bench_soak.batch(data, s, 0, step, False, device), combo, s)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    _sync(device)
    ms = (time.perf_counter() - began) / steps * 1e3
    return {"ms_per_step": round(ms, 2), "losses": [float(v) for v in losses]}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    ap.add_argument("--steps", type=int, default=30, help="timed steps per recipe and mode")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="a CPU and the soak's toy size: the code path only")
    ap.add_argument("--compile", action="store_true", help="a third column: the codes path, quantizers compiled")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        ap.error("no CUDA GPU: this bench times a GPU's GEMMs (--smoke runs the code path on a CPU)")
    s = bench_soak.setup(args.warmup + args.steps, args.smoke)
    coded = "always" if args.smoke else "cuda"
    rows = {"bf16": {"float32": time_steps("bf16", "never", s, args.steps, args.warmup)}}
    for recipe in args.recipes:
        rows[recipe] = {"float32": time_steps(recipe, "never", s, args.steps, args.warmup),
                        "codes": time_steps(recipe, coded, s, args.steps, args.warmup)}
        if args.compile:
            compiled_quantizers(True)
            try:
                rows[recipe]["compiled"] = time_steps(recipe, coded, s, args.steps, args.warmup)
            finally:
                compiled_quantizers(False)
    extra = " compiled quantizers, ms/step | its speed-up | its max loss difference |" if args.compile else ""
    print(f"| recipe | float32 GEMMs, ms/step | BF16-code GEMMs, ms/step | speed-up | max loss difference |{extra}")
    print("|---|---|---|---|---|" + ("---|---|---|" if args.compile else ""))
    print(f"| bf16 (no emulated layer) | {rows['bf16']['float32']['ms_per_step']} | | | |" + (" | | |" if args.compile
                                                                                            else ""))
    for recipe in args.recipes:
        a, b = rows[recipe]["float32"], rows[recipe]["codes"]
        diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
        rows[recipe] |= {"speedup": round(a["ms_per_step"] / b["ms_per_step"], 2), "max_loss_diff": diff}
        line = f"| {recipe} | {a['ms_per_step']} | {b['ms_per_step']} | {rows[recipe]['speedup']}x | {diff:.2e} |"
        if "compiled" in rows[recipe]:
            c = rows[recipe]["compiled"]
            rows[recipe] |= {"compiled_speedup": round(a["ms_per_step"] / c["ms_per_step"], 2),
                             "compiled_max_loss_diff": max(abs(x - y) for x, y in zip(a["losses"], c["losses"]))}
            line += (f" {c['ms_per_step']} | {rows[recipe]['compiled_speedup']}x | "
                     f"{rows[recipe]['compiled_max_loss_diff']:.2e} |")
        print(line, flush=True)
    report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name()
              if torch.cuda.is_available() and not args.smoke else "cpu", "setup": vars(args) | {"json": None},
              "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
