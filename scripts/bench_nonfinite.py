"""Cost of the non-finite check on a probe: the optimizer states and weights read after every step.

The loss and gradient checks cost nothing (they read the loss and the clip's gradient norm, which the probe
reads anyway); what costs is :meth:`NonFiniteWatch.after_update`, one fused norm over every state tensor and
weight after each optimizer step (:mod:`precsearch.probe.measure.nonfinite`). This runs the quickstart's probe
(or ``--space``'s) under each policy twice, with the check and with it switched off, in turn ``--repeats``
times, and reports the median probe wall time of each, the check's own time per step (timed around each call)
and that time as a share of the median step.

    python scripts/bench_nonfinite.py                                  # the CPU quickstart, ~2 min on 2 cores
    python scripts/bench_nonfinite.py --steps 20 --repeats 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from precsearch.backends import get_backend
from precsearch.config.loader import load_space
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.data import load_batches
from precsearch.probe.measure.nonfinite import NonFiniteWatch
from precsearch.probe.runner import run_probe

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {
    "BF16": Policy.bf16(),
    "FP8 delayed, every Linear": Policy(rules=(Rule("all", ("*",), Precision.FP8_DELAYED),)),
}


def _probe(space, data, backend, policy: Policy, checked: bool) -> tuple[float, list[float], list[float]]:
    """One probe: its wall time, its losses, and the seconds of each ``after_update`` call (none when off)."""
    real, seconds = NonFiniteWatch.after_update, []

    def timed(watch, step):
        t0 = time.perf_counter()
        real(watch, step)
        seconds.append(time.perf_counter() - t0)

    NonFiniteWatch.after_update = timed if checked else (lambda watch, step: None)
    try:
        t0 = time.perf_counter()
        result = run_probe(space.model.probe(), space.probe, policy, data, backend, torch.device(space.probe.device))
        return time.perf_counter() - t0, result.losses, seconds
    finally:
        NonFiniteWatch.after_update = real


def bench(space_path: Path, steps: int | None, repeats: int) -> list[dict]:
    """Per policy: median wall time with and without the check, the check's median time per step."""
    space = load_space(space_path)
    if steps:
        space = space.model_copy(update={"probe": space.probe.model_copy(update={"steps": steps})})
    data, backend = load_batches(space), get_backend(space.backend.value, torch.device(space.probe.device))
    rows = []
    for name, policy in POLICIES.items():
        walls: dict[bool, list[float]] = {True: [], False: []}
        checks, losses = [], {}
        for _ in range(repeats):
            for checked in (True, False):  # in turn: load on the machine hits both alike
                wall, losses[checked], seconds = _probe(space, data, backend, policy, checked)
                walls[checked].append(wall)
                checks += seconds
        step_s = statistics.median(walls[False]) / space.probe.steps
        check_s = statistics.median(checks)
        rows.append({"policy": name, "steps": space.probe.steps, "wall_on_s": statistics.median(walls[True]),
                     "wall_off_s": statistics.median(walls[False]), "check_ms": 1e3 * check_s,
                     "step_ms": 1e3 * step_s, "check_share": check_s / step_s,
                     "losses_identical": losses[True] == losses[False]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", type=Path, default=ROOT / "search_spaces" / "quickstart.yaml")
    ap.add_argument("--steps", type=int, default=None, help="probe steps (default: the space's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    rows = bench(args.space, args.steps, args.repeats)
    print(f"{'policy':<28} {'steps':>5} {'wall on s':>10} {'wall off s':>10} {'check ms':>9} {'step ms':>8} "
          f"{'share':>7}  losses identical")
    for r in rows:
        print(f"{r['policy']:<28} {r['steps']:>5} {r['wall_on_s']:>10.2f} {r['wall_off_s']:>10.2f} "
              f"{r['check_ms']:>9.3f} {r['step_ms']:>8.1f} {100 * r['check_share']:>6.2f}%  {r['losses_identical']}")
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
