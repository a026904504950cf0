"""What the fixed-state damage reading costs next to a trial, and what it reads, on a space's own probe.

In one process, on the space's model, data and backend: the BF16 side of the reading (the BF16 run to its
states and the BF16 gradients there, paid once per gradient-clipping value, like the references), then for
each policy its trial probe (``run_probe``, the study's trajectory probe) and its reading, timed apart.
Prints a table and writes JSON (the reading's share of a trial: reading / (trial probe + reading)).

With ``--keep-states host device`` there is one reader per ``objectives.damage.keep_states`` value, each with
its own BF16 side (timed, with the device's peak allocation while it ran); each policy's trial probe runs once,
beside the first reader, and every reader reads every policy, so the table has a reading time and share per
value side by side. ``--compile-compare on off`` does the same for ``objectives.damage.compile_compare`` (readers
are then labelled ``keep/on`` and ``keep/off``). Before the timed readings each reader takes one untimed-in-the-rows
reading of the first policy, reported apart as ``first_read_s`` (on CUDA with compile on, it includes compiling
the compare step, once per process). The readers run one after the other (two BF16 sides at once would not fit beside an 8B-wide
probe); the JSON gives the device's peak while each reader read (``reading_max_allocated_bytes_by_keep``). The JSON keeps the first value's figures under
the single-reader keys and adds ``*_by_keep`` entries.

    python scripts/bench_damage_cost.py search_spaces/llama3_8b_h100.yaml --out $OUT      # H200
    python scripts/bench_damage_cost.py search_spaces/llama3_8b_h100.yaml --out $OUT --keep-states host device
    python scripts/bench_damage_cost.py search_spaces/cpu_smoke.yaml --out /tmp/dc           # CPU, ~1 min
"""

from __future__ import annotations

import argparse
import datetime
import gc
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


def _max_allocated(device: torch.device) -> int | None:
    """The device's peak allocated bytes since the last reset (None off CUDA, where it is not measured)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def make_reader(space, cfg, data, backend, device, keep: str, compile_compare: bool | None = None) -> DamageReader:
    """A reader on the space's damage settings with ``keep_states`` set to ``keep`` (and ``compile_compare``,
    unless None)."""
    update = {"keep_states": keep} | ({} if compile_compare is None else {"compile_compare": compile_compare})
    return DamageReader(cfg, space.probe, data, backend, device, space.objectives.damage.model_copy(update=update),
                        space.model.start(), space.baseline_knobs())


def reader_labels(keeps: list[str], compiles: list[str] | None) -> dict[str, tuple[str, bool | None]]:
    """Each reader's label and its (keep_states, compile_compare): ``keep`` alone unless compiles are given."""
    if not compiles:
        return {keep: (keep, None) for keep in keeps}
    return {f"{keep}/{c}": (keep, c == "on") for keep in keeps for c in compiles}


def bf16_side(reader: DamageReader, clip: float | None, device: torch.device) -> dict[str, float | int | None]:
    """Compute ``reader``'s BF16 side: its seconds, and the device's peak allocation while it ran."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    reader.bf16_sides(clip)
    _sync(device)
    return {"seconds": time.perf_counter() - t0, "max_allocated_bytes": _max_allocated(device),
            "held_bytes": reader.device_bytes()}


def read_timed(reader: DamageReader, policy: Policy, device: torch.device) -> dict:
    """``policy``'s reading, with the device's peak allocation while it was taken (``max_allocated_bytes``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    reading = reader.read(policy)
    _sync(device)
    return reading | {"max_allocated_bytes": _max_allocated(device)}


def _release(device: torch.device) -> None:
    """Give a dropped reader's device memory back, so the next reader starts from the same free memory."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def row(name: str, probe_s: float, result, readings: dict[str, dict], held: int) -> dict:
    """A policy's row: the first reader's figures under the single-reader keys, every reader's ``*_by_keep``."""
    first = next(iter(readings.values()))
    total = first["states"][-1]["total"]
    return {"policy": name, "probe_s": probe_s, "reading_s": first["seconds"],
            "share": first["seconds"] / (probe_s + first["seconds"]), "value": first["value"],
            "measure": first["measure"], "end_state": {k: v[0] for k, v in total.items()},
            "eval_loss": result.eval_loss, "parts_s": first["seconds_by_part"],
            "state_step": first["state_step"], "peak_gib": result.peak_memory_bytes / 2**30,
            "reader_held_gib": held / 2**30,
            "reading_s_by_keep": {k: r["seconds"] for k, r in readings.items()},
            "share_by_keep": {k: r["seconds"] / (probe_s + r["seconds"]) for k, r in readings.items()},
            "value_by_keep": {k: r["value"] for k, r in readings.items()},
            "parts_s_by_keep": {k: r["seconds_by_part"] for k, r in readings.items()}}


def log_row(r: dict, readings: dict[str, dict]) -> None:
    reads = "; ".join(f"reading ({k}) {x['seconds']:.2f} s ("
                      + ", ".join(f"{p} {v:.2f} s" for p, v in x["seconds_by_part"].items()) + ")"
                      for k, x in readings.items())
    print(f"  {r['policy']}: probe {r['probe_s']:.2f} s, {reads}, {r['measure']} {r['value']:.4g} (worst state: "
          f"step {r['state_step']}), probe peak {r['peak_gib']:.2f} GiB", file=sys.stderr, flush=True)


def table(rows: list[dict], keeps: list[str]) -> None:
    """The table: probe time, then a reading time and share per ``keep_states`` value, then the end state."""
    heads = [f"{'read s (' + k + ')':>{len(k) + 9}} {'share (' + k + ')':>{len(k) + 8}}" for k in keeps]
    print(f"{'policy':22s} {'probe s':>8} " + " ".join(heads) + "  "
          + "  ".join(f"{k:>14}" for k in rows[0]["end_state"]))
    for r in rows:
        cells = [f"{r['reading_s_by_keep'][k]:{len(k) + 9}.2f} {100 * r['share_by_keep'][k]:{len(k) + 7}.1f}%"
                 for k in keeps]
        print(f"{r['policy']:22s} {r['probe_s']:8.2f} " + " ".join(cells) + "  "
              + "  ".join(f"{v:14.4g}" for v in r["end_state"].values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("scripts/results"))
    ap.add_argument("--keep-states", nargs="+", choices=["host", "device"], default=["host"],
                    help="objectives.damage.keep_states values to read with, one reader each (default: host)")
    ap.add_argument("--compile-compare", nargs="+", choices=["on", "off"], default=None,
                    help="objectives.damage.compile_compare values, one reader each per keep_states value "
                         "(default: the space's)")
    args = ap.parse_args(argv)
    labels = reader_labels(list(dict.fromkeys(args.keep_states)),  # a value given twice is one reader
                           list(dict.fromkeys(args.compile_compare)) if args.compile_compare else None)
    keeps = list(labels)
    space = load_space(args.space)
    device = resolve_device(space.probe.device)
    backend = get_backend(space.backend.value, device)
    data, cfg = load_batches(space), space.model.probe()
    named = policies(args.clip, space.baseline_knobs())
    # one reader at a time (both at once would hold two BF16 sides on the device): the trial probes run
    # beside the first, and every reader reads the same policies, so the reading times stand side by side
    sides, probes, readings, first_read = {}, {}, {name: {} for name in named}, {}
    for keep in keeps:
        reader = make_reader(space, cfg, data, backend, device, *labels[keep])
        sides[keep] = bf16_side(reader, args.clip, device)
        peak = sides[keep]["max_allocated_bytes"]
        print(f"BF16 side, reader {keep} (states + BF16 gradients, once): {sides[keep]['seconds']:.1f} s"
              + (f", device peak {peak / 2**30:.2f} GiB" if peak is not None else "")
              + f", held {sides[keep]['held_bytes'] / 2**30:.2f} GiB", file=sys.stderr, flush=True)
        first_read[keep] = read_timed(reader, next(iter(named.values())), device)["seconds"]
        print(f"  first reading, {keep} (compiles the compare step where it is compiled): {first_read[keep]:.2f} s",
              file=sys.stderr, flush=True)
        for name, policy in named.items():
            if name not in probes:
                t0 = time.perf_counter()
                result = run_probe(cfg, space.probe, policy, data, backend, device, target=space.model.target(),
                                   held_bytes=reader.device_bytes())
                _sync(device)
                probes[name] = (time.perf_counter() - t0, result)
            readings[name][keep] = read_timed(reader, policy, device)
            r = readings[name][keep]
            print(f"  {name}, reader {keep}: reading {r['seconds']:.2f} s ("
                  + ", ".join(f"{p} {v:.2f} s" for p, v in r["seconds_by_part"].items())
                  + f"), {r['measure']} {r['value']:.4g} (worst state: step {r['state_step']})", file=sys.stderr,
                  flush=True)
        del reader
        _release(device)
    rows = [row(name, *probes[name], readings[name], sides[keeps[0]]["held_bytes"]) for name in named]
    for r in rows:
        log_row(r, readings[r["policy"]])
    table(rows, keeps)
    meta = {"space": str(args.space), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "date": datetime.date.today().isoformat(), "bf16_side_s": sides[keeps[0]]["seconds"],
            "torch": torch.__version__, "damage": space.objectives.damage.model_dump(mode="json"),
            "keep_states": keeps, "readers": {k: {"keep_states": v[0], "compile_compare": v[1]}
                                              for k, v in labels.items()},
            "first_read_s_by_keep": first_read, "bf16_side_s_by_keep": {k: v["seconds"] for k, v in sides.items()},
            "bf16_max_allocated_bytes_by_keep": {k: v["max_allocated_bytes"] for k, v in sides.items()},
            "reader_held_bytes_by_keep": {k: v["held_bytes"] for k, v in sides.items()},
            "reading_max_allocated_bytes_by_keep": {k: max((readings[n][k]["max_allocated_bytes"] or 0)
                                                           for n in named) or None for k in keeps}}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{meta['date']}_bench_damage_cost_{args.space.stem}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
