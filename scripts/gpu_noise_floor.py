"""FP8 recipes scored against BF16 seed noise: final and tail readings, risk score, optional stress probe.

Runs, on a space file's probe shape: the BF16 reference at ``--seeds`` seeds
(their spread is the noise floor), Transformer Engine FP8 (delayed, current,
block scaling) on every transformer-block Linear, paired with the BF16 seed
they share, and, with ``--stress M``, each again at ``lr x M`` next to a BF16
run at that lr. Prints one row per recipe (loss gap, gap in BF16 seed
spreads, per-step events, verdicts) and writes JSON. Each recipe is read both
ways (``objectives.reading``): ``final``, the held-out loss gap after training,
and ``tail``, the paired training-loss gap over the last quarter of the run
with negative gaps counting as zero; plus the early-warning risk score against
the paired BF16 reference.

    python scripts/gpu_noise_floor.py search_spaces/llama3_8b_h100.yaml --seeds 3 --stress 4 \
        --json $OUT/noise_floor.json

The stability verdicts use the space's ``objectives`` with ``reference_seeds``
and ``stress.lr_multiplier`` replaced by the flags.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from precsearch.backends import get_backend, resolve_device
from precsearch.config.loader import load_space
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.measure.events import count_events
from precsearch.probe.runner import run_probe
from precsearch.runtime.reference import ReferenceCache, gather_references, stress_probe
from precsearch.search.scoring import score
from precsearch.probe.data import load_batches
from precsearch.probe.measure.risk import risk_score, seed_spread
from precsearch.probe.measure.signals import Signals

RECIPES = (Precision.FP8_DELAYED, Precision.FP8_CURRENT, Precision.FP8_BLOCK)


def main() -> None:
    args = _args()
    space = load_space(args.space)
    objectives = space.objectives.model_copy(update={
        "reference_seeds": args.seeds,
        "stress": space.objectives.stress.model_copy(update={"lr_multiplier": args.stress})})
    space = space.model_copy(update={"objectives": objectives})
    device = resolve_device(space.probe.device)
    backend = get_backend(space.backend.value, device)
    cfg, data = space.model.probe(), load_batches(space)
    memory = MemoryKnobs(**space.objectives.baseline_memory.model_dump())
    bf16 = Policy.bf16(args.clip, memory)

    def run(policy: Policy, probe, label: str):
        print(f"  {label} (seed {probe.seed}, lr {probe.lr:g})", file=sys.stderr, flush=True)
        return run_probe(cfg, probe, policy, data, backend, device)

    refs = gather_references(space, ReferenceCache(Path(tempfile.mkdtemp())), device, args.clip,
                             lambda probe, label, leg: run(bf16, probe, label))
    stressed = stress_probe(space)
    rows = []
    for precision in RECIPES:
        policy = replace(bf16, rules=(Rule("blocks", ("decoder.layers.*",), precision),))
        result = run(policy, space.probe, precision.value)
        pair = (run(policy, stressed, f"{precision.value} (stress)"), refs.stress) if stressed else None
        s = score(result, refs.paired, objectives, noise_floor=refs.noise_floor, stress=pair)
        tail = objectives.model_copy(update={"reading": "tail"})
        t = score(result, refs.paired, tail, noise_floor=refs.noise_floor_in(tail), stress=pair)
        risk = risk_score(Signals.from_dict(result.signals), Signals.from_dict(refs.paired.signals),
                          spread=seed_spread([Signals.from_dict(r.signals) for r in refs.seeds]))
        rows.append({"recipe": precision.value, "eval_loss": result.eval_loss, "tail": t.to_dict(),
                     "risk_score": risk.score, "risk_excess": risk.excess, "signals": result.signals,
                     "events": {k: count_events(result.events, k) for k in ("loss_spike", "grad_blowup", "non_finite")},
                     "diverged_step": result.diverged_step, **s.to_dict()})
    report = {"space": str(args.space), "clip_grad": args.clip, "device": str(device),
              "bf16_eval_losses": [r.eval_loss for r in refs.seeds], "noise_floor": refs.noise_floor,
              "tail_noise_floor": refs.noise_floor_in(objectives.model_copy(update={"reading": "tail"})),
              "reference_signals": refs.paired.signals, "seed_signals": [r.signals for r in refs.seeds],
              "bf16_stress_eval_loss": refs.stress.eval_loss if refs.stress else None,
              "objectives": objectives.model_dump(mode="json"), "rows": rows}
    _print(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))


def _print(report: dict) -> None:
    losses = ", ".join(f"{x:.4f}" for x in report["bf16_eval_losses"])
    print(f"BF16 held-out loss over seeds: {losses}; noise floor {100 * report['noise_floor']:.3f}%")
    print(f"tail-reading noise floor {100 * report['tail_noise_floor']:.3f}%")
    print(f"{'recipe':<12} {'loss gap':>9} {'gap/noise':>9} {'spikes':>6} {'blowups':>7} {'stable':>6} "
          f"{'stress gap':>10} {'stress':>8} {'tail gap':>9} {'tail instab.':>12} {'tail stable':>11} {'risk':>5}")
    for r in report["rows"]:
        gap = "diverged" if r["diverged"] else f"{100 * r['loss_gap']:+.3f}%"
        stress_gap = "-" if r["stress_loss_gap"] is None else (
            "diverged" if r["stress_diverged"] else f"{100 * r['stress_loss_gap']:+.3f}%")
        noise = f"{r['gap_in_noise']:+.2f}" if math.isfinite(r["gap_in_noise"]) else "-"
        print(f"{r['recipe']:<12} {gap:>9} {noise:>9} {r['events']['loss_spike']:>6} "
              f"{r['events']['grad_blowup']:>7} {str(r['stable']):>6} {stress_gap:>10} "
              f"{str(r['stable_under_stress']):>8} {100 * r['tail']['tail_gap']:+8.3f}% "
              f"{100 * r['tail']['instability']:11.3f}% {str(r['tail']['stable']):>11} {r['risk_score']:5.2f}")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("space", type=Path)
    p.add_argument("--seeds", type=int, default=3, help="BF16 reference seeds (>= 2 for a noise floor)")
    p.add_argument("--stress", type=float, default=None, help="stress lr multiplier (> 1); off if unset")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping for every run")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args()


if __name__ == "__main__":
    main()
