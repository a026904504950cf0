"""Cost of the probe's non-finite check: the optimizer states and weights read after every step.

The loss and gradient checks cost nothing (they read the loss and the clip's gradient norm, which the probe reads
anyway); what costs is :meth:`~precsearch.probe.measure.nonfinite.NonFiniteWatch.after_update`, one fused norm
over every state tensor and weight after each optimizer step, FP8 moments tested on their bits
(:mod:`precsearch.probe.measure.nonfinite`). It runs after the probe's clock stops for the step, so it costs wall
time and not tokens/s: "x on" and "x off" below should agree within the steps' noise (until 2026-12-07 it ran
inside the timed step, and on an H100 it took an FP8 policy's speed-up from 1.18x to 1.04x).

This runs a space's probe under two policies: the BF16 reference with the space's baseline memory knobs
(``objectives.baseline_memory``), and FP8 current scaling on every block Linear with the space's most
memory-saving optimizer state (remainders master and ``fp8_block`` moments where the space can hold them; the
CPU default keeps the space's knobs). Each runs with the check and with it switched off, in turn, ``--repeats``
times; the report gives the median probe wall time of each, the check's own median time per step (timed around
each call, after a device synchronize) and that time as a share of the median step, and each policy's speed-up
over BF16 with and without the check.

    python benchmarks/bench_nonfinite.py                       # the CPU quickstart, ~2 min on 2 cores
    python benchmarks/bench_nonfinite.py --space search_spaces/llama3_8b_h100_accelerate.yaml --steps 20 \\
        --repeats 1 --json $OUT/bench_nonfinite.json            # a GPU: the 8B width at the probe's 4 blocks
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from precsearch.backends import get_backend
from precsearch.config.loader import load_space
from precsearch.policy import Policy, Rule
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Precision
from precsearch.probe.data import load_batches
from precsearch.probe.measure.nonfinite import NonFiniteWatch
from precsearch.probe.runner import run_probe

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = ("*.self_attention.*", "*.mlp.*")


def policies(space) -> dict[str, Policy]:
    """The BF16 reference as a study trains it, and FP8 current GEMMs with the most memory-saving state."""
    baseline = MemoryKnobs(**space.objectives.baseline_memory.model_dump()).resolved(space.probe.param_dtype)
    saving = baseline
    if space.probe.param_dtype == "bf16" and space.backend.value == "te":
        saving = MemoryKnobs(master_weights=True, master_dtype="remainders", moment_dtype="fp8_block")
    fp8 = tuple(Rule(f"blocks{i}", (pattern,), Precision.FP8_CURRENT) for i, pattern in enumerate(BLOCKS))
    return {"BF16 (baseline state)": dataclasses.replace(Policy.bf16(), memory=baseline),
            "FP8 current, remainders + fp8_block" if saving != baseline else "FP8 current (baseline state)":
                Policy(rules=fp8, memory=saving)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _probe(space, data, backend, policy: Policy, checked: bool) -> tuple[float, float, list[float]]:
    """One probe: its wall time, its tokens/s, and the seconds of each ``after_update`` call (none when off)."""
    device = torch.device(space.probe.device)
    real, seconds = NonFiniteWatch.after_update, []

    def timed(watch, step):
        _sync(device)
        t0 = time.perf_counter()
        real(watch, step)
        _sync(device)
        seconds.append(time.perf_counter() - t0)

    NonFiniteWatch.after_update = timed if checked else (lambda watch, step: None)
    try:
        t0 = time.perf_counter()
        result = run_probe(space.model.probe(), space.probe, policy, data, backend, device)
        return time.perf_counter() - t0, result.tokens_per_s, seconds
    finally:
        NonFiniteWatch.after_update = real


def bench(space_path: Path, steps: int | None, repeats: int) -> dict[str, Any]:
    """Per policy: median wall time and tokens/s with and without the check, the check's median time per step."""
    space = load_space(space_path)
    if steps:
        space = space.model_copy(update={"probe": space.probe.model_copy(update={"steps": steps})})
    data, backend = load_batches(space), get_backend(space.backend.value, torch.device(space.probe.device))
    rows = []
    for name, policy in policies(space).items():
        walls: dict[bool, list[float]] = {True: [], False: []}
        speed: dict[bool, list[float]] = {True: [], False: []}
        checks: list[float] = []
        for _ in range(repeats):
            for checked in (True, False):  # in turn: load on the machine hits both alike
                wall, tokens_per_s, seconds = _probe(space, data, backend, policy, checked)
                walls[checked].append(wall)
                speed[checked].append(tokens_per_s)
                checks += seconds
        on, off = statistics.median(speed[True]), statistics.median(speed[False])
        step_s = space.probe.seq_len * space.probe.micro_batch * space.probe.grad_accum / off if off else \
            statistics.median(walls[False]) / space.probe.steps
        rows.append({"policy": name, "memory": dataclasses.asdict(policy.memory), "steps": space.probe.steps,
                     "wall_on_s": statistics.median(walls[True]), "wall_off_s": statistics.median(walls[False]),
                     "tokens_per_s_on": on, "tokens_per_s_off": off, "check_ms": 1e3 * statistics.median(checks),
                     "step_ms": 1e3 * step_s, "check_share": statistics.median(checks) / step_s})
    base = rows[0]
    for r in rows:
        r["speedup_on"] = r["tokens_per_s_on"] / base["tokens_per_s_on"] if base["tokens_per_s_on"] else None
        r["speedup_off"] = r["tokens_per_s_off"] / base["tokens_per_s_off"] if base["tokens_per_s_off"] else None
    device = torch.cuda.get_device_name() if space.probe.device.startswith("cuda") else platform.processor() or "cpu"
    return {"space": str(space_path), "device": device, "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "repeats": repeats, "rows": rows}


def table(report: dict[str, Any]) -> str:
    lines = [f"{report['space']} on {report['device']}",
             f"{'policy':<38} {'steps':>5} {'tok/s on':>9} {'tok/s off':>9} {'check ms':>9} {'step ms':>8} "
             f"{'share':>7} {'x on':>6} {'x off':>6}"]
    for r in report["rows"]:
        lines.append(f"{r['policy']:<38} {r['steps']:>5} {r['tokens_per_s_on']:>9.0f} {r['tokens_per_s_off']:>9.0f} "
                     f"{r['check_ms']:>9.3f} {r['step_ms']:>8.1f} {100 * r['check_share']:>6.2f}% "
                     f"{r['speedup_on'] or 0:>6.3f} {r['speedup_off'] or 0:>6.3f}")
    lines.append("x on / x off: the policy's tokens/s over the BF16 reference's, with the check and without it")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", type=Path, default=ROOT / "search_spaces" / "quickstart.yaml")
    ap.add_argument("--steps", type=int, default=None, help="probe steps (default: the space's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if args.repeats < 1 or (args.steps is not None and args.steps < 2):
        ap.error("need --repeats >= 1 and --steps >= 2")
    report = bench(args.space, args.steps, args.repeats)
    print(table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
