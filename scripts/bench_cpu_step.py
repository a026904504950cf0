"""CPU step time of the quickstart probe: BF16 and emulated FP8, native BF16 GEMMs against float32 GEMMs.

Issue 16: a BF16 reference step cost about 3x an emulated-FP8 trial step on a
2-core AMD EPYC. The probe's BF16 Linear layers now run float32 GEMMs on BF16
operands on a CPU (:mod:`precsearch.cpu_bf16`); ``native`` is the previous path
(autocast's BF16 GEMM), which a study still takes on a CPU with BF16 dot
products (``study_gemm_path`` in the output). The four probes (BF16 / FP8 policy x native / float32
GEMMs) train side by side, one step of each in turn, so machine load hits them
alike; the table gives each one's median step time.

    python scripts/bench_cpu_step.py --steps 12 --json out.json
    python scripts/bench_cpu_step.py --no-native-bf16    # as on a CPU without BF16 dot products (AVX2 only)

``--no-native-bf16`` re-runs the script with ``ATEN_CPU_CAPABILITY=avx2`` and
``ONEDNN_MAX_CPU_ISA=AVX2``, which keep PyTorch and oneDNN off AVX-512 (and so
off AVX512_BF16 and AMX), as on an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from precsearch import cpu_bf16
from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.loader import load_space
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe import runner
from precsearch.probe.data import load_batches

ROOT = Path(__file__).resolve().parents[1]
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
POLICIES = {
    "BF16": Policy.bf16(),
    "FP8 current, every Linear": Policy(rules=(Rule("all", ("*",), Precision.FP8_CURRENT),)),
}


def cpu_flags() -> list[str]:
    """The CPU's BF16-related feature flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags.split(":", 1)[1].split() if "bf16" in f or f.startswith("amx") or f == "avx2")


def bench(space_path: Path, steps: int) -> list[dict]:
    """Median step time of each policy x GEMM path, the probes stepping in turn."""
    space = load_space(space_path)
    cfg, probe, data, backend = space.model.probe(), space.probe, load_batches(space), EmulatedBackend()
    device = torch.device("cpu")
    probes = []
    for policy_name, policy in POLICIES.items():
        for gemms in ("native BF16", "float32"):
            model = runner.build_probe(cfg, policy, backend, device, probe.seed)
            opt = torch.optim.AdamW(model.parameters(), lr=probe.lr, betas=probe.betas)
            probes.append({"policy": policy_name, "gemms": gemms, "model": model, "opt": opt,
                           "fp8": policy.uses_fp8, "times": [], "losses": []})
    for step in range(steps):
        for p in probes:
            with _gemm_path(p["gemms"]):
                t0 = time.perf_counter()
                loss, _ = runner._train_step(p["model"], p["opt"], data, step, p["fp8"], None, backend, device)
                p["times"].append(time.perf_counter() - t0)
            p["losses"].append(loss)
    return [{"policy": p["policy"], "gemms": p["gemms"], "median_s": statistics.median(p["times"][1:]),
             "step_s": p["times"], "losses": p["losses"]} for p in probes]


class _gemm_path:
    """``native BF16``: the probe's Linear layers call ``F.linear`` (autocast's BF16 GEMM), as before;
    ``float32``: :func:`precsearch.cpu_bf16.linear`'s float32 GEMMs, whatever this CPU has."""

    def __init__(self, gemms: str):
        self.native = gemms == "native BF16"

    def __enter__(self):
        self.saved = cpu_bf16.linear, cpu_bf16.native_bf16_gemms
        if self.native:
            cpu_bf16.linear = F.linear
        else:
            cpu_bf16.native_bf16_gemms = lambda: False

    def __exit__(self, *exc):
        cpu_bf16.linear, cpu_bf16.native_bf16_gemms = self.saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", type=Path, default=ROOT / "search_spaces" / "quickstart.yaml")
    parser.add_argument("--steps", type=int, default=12, help="steps per probe (the first is not timed)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-native-bf16", action="store_true", help="run as on an AVX2-only CPU")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.no_native_bf16 and os.environ.get("ATEN_CPU_CAPABILITY") != "avx2":
        argv = [a for a in sys.argv[1:] if a != "--no-native-bf16"]
        env = os.environ | AVX2_ENV
        sys.exit(subprocess.call([sys.executable, __file__, *argv, "--no-native-bf16"], env=env))
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = bench(args.space, args.steps)
    info = {"cpu_flags": cpu_flags(), "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "study_gemm_path": cpu_bf16.gemm_path(),
            "env": {k: os.environ.get(k) for k in AVX2_ENV}, "threads": torch.get_num_threads(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "space": str(args.space)}
    print(json.dumps(info))
    print(f"{'policy':28} {'GEMMs':12} {'median s/step':>14}")
    for r in rows:
        print(f"{r['policy']:28} {r['gemms']:12} {r['median_s']:14.3f}")
    if args.json:
        args.json.write_text(json.dumps({"info": info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
