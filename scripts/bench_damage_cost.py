"""What the fixed-state damage reading costs next to a trial, and what it reads, on a space's own probe.

In one process, on the space's model, data and backend: the BF16 side of the reading (the BF16 run to its
states and the BF16 gradients there, paid once per gradient-clipping value, like the references), then for
each policy its trial probe (``run_probe``, the study's trajectory probe) and its reading, timed apart.
Prints a table and writes JSON (the reading's share of a trial: reading / (trial probe + reading)).

    python scripts/bench_damage_cost.py search_spaces/llama3_8b_h100.yaml --out $OUT      # H200
    python scripts/bench_damage_cost.py search_spaces/cpu_smoke.yaml --out /tmp/dc           # CPU, ~1 min
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from precsearch.backends import get_backend, resolve_device
from precsearch.config.loader import load_space
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.damage import DamageReader
from precsearch.probe.data import load_batches
from precsearch.probe.runner import run_probe


def policies(clip: float | None, memory: MemoryKnobs) -> dict[str, Policy]:
    """A few policies with the baseline's memory knobs (the reading then sees their compute alone)."""
    def fp8(p: Precision, modules=("decoder.layers.*",)) -> Policy:
        return Policy(rules=(Rule("fp8", modules, p),), clip_grad=clip, memory=memory)

    return {"BF16": Policy.bf16(clip, memory), "fp8_delayed, blocks": fp8(Precision.FP8_DELAYED),
            "fp8_current, blocks": fp8(Precision.FP8_CURRENT), "fp8_block, MLP": fp8(Precision.FP8_BLOCK, ("*.mlp.*",))}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("scripts/results"))
    args = ap.parse_args(argv)
    space = load_space(args.space)
    device = resolve_device(space.probe.device)
    backend = get_backend(space.backend.value, device)
    data, cfg = load_batches(space), space.model.probe()
    reader = DamageReader(cfg, space.probe, data, backend, device, space.objectives.damage, space.model.start(),
                          space.baseline_knobs())
    t0 = time.perf_counter()
    reader.bf16_sides(args.clip)
    _sync(device)
    shared = time.perf_counter() - t0
    print(f"BF16 side (states + BF16 gradients, once): {shared:.1f} s", file=sys.stderr, flush=True)
    rows = []
    for name, policy in policies(args.clip, space.baseline_knobs()).items():
        t0 = time.perf_counter()
        result = run_probe(cfg, space.probe, policy, data, backend, device, target=space.model.target(),
                           held_bytes=reader.device_bytes())
        _sync(device)
        probe_s = time.perf_counter() - t0
        reading = reader.read(policy)
        _sync(device)
        total = reading["states"][-1]["total"]
        rows.append({"policy": name, "probe_s": probe_s, "reading_s": reading["seconds"],
                     "share": reading["seconds"] / (probe_s + reading["seconds"]), "value": reading["value"],
                     "measure": reading["measure"], "end_state": {k: v[0] for k, v in total.items()},
                     "eval_loss": result.eval_loss, "parts_s": reading["seconds_by_part"],
                     "state_step": reading["state_step"], "peak_gib": result.peak_memory_bytes / 2**30,
                     "reader_held_gib": reader.device_bytes() / 2**30})
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in reading["seconds_by_part"].items())
        print(f"  {name}: probe {probe_s:.2f} s, reading {reading['seconds']:.2f} s ({parts}), {reading['measure']} "
              f"{reading['value']:.4g} (worst state: step {reading['state_step']}), probe peak "
              f"{result.peak_memory_bytes / 2**30:.2f} GiB", file=sys.stderr, flush=True)
    print(f"{'policy':22s} {'probe s':>8} {'read s':>7} {'share':>6}  " + "  ".join(f"{k:>14}" for k in
                                                                                  rows[0]["end_state"]))
    for r in rows:
        print(f"{r['policy']:22s} {r['probe_s']:8.2f} {r['reading_s']:7.2f} {100 * r['share']:5.1f}%  "
              + "  ".join(f"{v:14.4g}" for v in r["end_state"].values()))
    meta = {"space": str(args.space), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "date": datetime.date.today().isoformat(), "bf16_side_s": shared, "torch": torch.__version__,
            "damage": space.objectives.damage.model_dump(mode="json")}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{meta['date']}_bench_damage_cost_{args.space.stem}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
