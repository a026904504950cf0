"""How fast does the search find the front? TPE vs random search vs grid order, on CPU.

1. Table: a space small enough to enumerate (4 groups x 3 precisions x FP8
   warm-up {0, 10} x clip {None, 1.0} = 324 policies) is probed exhaustively,
   once per policy, with a reduced ``tiny`` probe on the emulated backend, and
   each policy's objectives (memory saved, instability) are cached on disk as
   JSON keyed by its params. On CPU, memory saved is the memory model's
   *prediction*, not a measurement.
2. Replay: for each sampler and seed an Optuna study looks each trial's policy
   up in that table (no probes), with precsearch's constraint (feasible iff
   instability <= the stability limit). After every trial, the hypervolume of
   the feasible front found so far is divided by that of the exhaustive
   feasible front (reference point: memory saved 0, instability = the limit).
3. Report: HV fraction at 10/20/50% of the table, trials to reach 95% of the
   exhaustive HV and to reach the HV random search has after 10% of the
   table, and the ratio of random's trials to each sampler's. "Trials to X"
   is the first trial at which the HV curve averaged over seeds reaches X
   (per-seed counts, means and medians are in the JSON); "unique" is the mean
   number of distinct policies among the trials (``precsearch run`` re-uses a
   finished twin's result, so a repeated policy costs no probe).

    python scripts/bench_search.py --json scripts/results/2026-11-29_cpu_bench_search.json
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import torch

from precsearch.backends import get_backend
from precsearch.config.loader import parse_space
from precsearch.config.space import Sampler, Space, StudySection
from precsearch.policy import MemoryKnobs, Policy
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import run_probe
from precsearch.search.hypervolume import hypervolume
from precsearch.search.pareto import pareto_indices
from precsearch.runtime.reference import ReferenceCache, reference_key
from precsearch.search.sampling import policy_from_params, suggest_policy
from precsearch.search.scoring import DIVERGED_INSTABILITY, score
from precsearch.runtime.stores import make_sampler
from precsearch.probe.data import load_batches

PRECISIONS = ["bf16", "fp8_current", "fp8_delayed"]
OBJECTIVES = ("memory_saved", "instability")
DIRECTIONS = ("maximize", "minimize")
FRACTIONS = (0.10, 0.20, 0.50)
HV_TARGET = 0.95
DEFAULT_CACHE = Path("precsearch-runs/bench_search/table.json")


# --------------------------------------------------------------------------- the space


def bench_space() -> Space:
    """The benchmark space: a reduced ``tiny`` probe (dim 64, 4 layers, seq 64, micro-batch 4, 30 steps)."""
    groups = [
        {"name": "lm_head", "modules": ["lm_head"]},
        {"name": "edge_blocks", "modules": ["*"], "layers": {"first": 1, "last": 1}},
        {"name": "attention", "modules": ["*.self_attn.*"]},
        {"name": "mlp", "modules": ["*.mlp.*"]},
    ]
    return parse_space({
        "model": {"preset": "tiny", "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "n_layers": 4},
        "data": {"source": "stdlib", "max_tokens": 200_000, "eval_batches": 2},
        "probe": {"steps": 30, "micro_batch": 4, "seq_len": 64, "lr": 3e-2, "seed": 0, "device": "cpu"},
        "backend": "emulated",
        "search": {
            "groups": [g | {"precision": {"choices": PRECISIONS}} for g in groups],
            "warmup_steps": {"choices": [0, 10]},
            "clip_grad": {"choices": [None, 1.0]},
        },
        "objectives": {"memory": True, "instability": True, "stability_limit": 0.01},
        "study": {"name": "bench_search", "sampler": "tpe", "seed": 0},
    }, file="<bench_search>")


def enumerate_params(space: Space) -> list[dict[str, Any]]:
    """Every policy of ``space`` as trial params, in a fixed (grid) order."""
    search = space.search
    names = [f"precision.{g.name}" for g in search.groups] + ["warmup_steps", "clip_grad"]
    options = [[p.value for p in g.precision.options()] for g in search.groups]
    options += [search.warmup_steps.options(), search.clip_grad.options()]
    return [dict(zip(names, combo)) for combo in itertools.product(*options)]


def param_key(params: dict[str, Any]) -> str:
    """The table's key for a policy: its params as sorted JSON."""
    return json.dumps(params, sort_keys=True)


# --------------------------------------------------------------------------- the table


def build_table(space: Space, cache: Path) -> dict[str, dict]:
    """Probe every policy once (reading back what ``cache`` already holds); return key -> row."""
    table: dict[str, dict] = json.loads(cache.read_text())["rows"] if cache.exists() else {}
    all_params = enumerate_params(space)
    todo = [p for p in all_params if param_key(p) not in table]
    print(f"table: {len(all_params) - len(todo)} of {len(all_params)} policies cached in {cache}; "
          f"probing {len(todo)}", flush=True)
    device = torch.device("cpu")
    backend = get_backend(space.backend.value, device)
    data = load_batches(space)
    references = ReferenceCache(cache.parent / "references")
    baseline = MemoryKnobs(**space.objectives.baseline_memory.model_dump())

    def probe(policy: Policy) -> ProbeResult:
        return run_probe(space.model.probe(), space.probe, policy, data, backend, device)

    start = time.perf_counter()
    for i, params in enumerate(todo, 1):
        policy = policy_from_params(space, params)
        reference = references.get(reference_key(space, policy.clip_grad, device),
                                   lambda: probe(Policy.bf16(policy.clip_grad, baseline)))
        t0 = time.perf_counter()
        result = probe(policy)
        table[param_key(params)] = _row(params, score(result, reference, space.objectives),
                                        result, time.perf_counter() - t0)
        if i % 10 == 0 or i == len(todo):
            _save_table(cache, table)
            print(f"  {i}/{len(todo)} probed, {time.perf_counter() - start:.0f} s", flush=True)
    return {param_key(p): table[param_key(p)] for p in all_params}


def _row(params: dict, s: Any, result: ProbeResult, wall_s: float) -> dict:
    return {"params": params, "memory_saved": s.memory_saved, "instability": s.instability,
            "loss_gap": s.loss_gap, "feasible": s.feasible, "diverged": s.diverged,
            "eval_loss": result.eval_loss, "peak_memory_bytes": result.peak_memory_bytes,
            "memory_source": result.memory_source, "probe_wall_s": round(wall_s, 3)}


def _save_table(cache: Path, table: dict[str, dict]) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rows": table}))
    os.replace(tmp, cache)


# --------------------------------------------------------------------------- hypervolume


def feasible_points(rows: Sequence[dict]) -> list[tuple[float, float]]:
    """(memory saved, instability) of the feasible rows."""
    return [(r["memory_saved"], r["instability"]) for r in rows if r["feasible"]]


def front_hv(rows: Sequence[dict], reference: tuple[float, float]) -> float:
    """Hypervolume of the feasible rows (dominated ones add nothing)."""
    return hypervolume(feasible_points(rows), DIRECTIONS, reference)


def hv_curve(order: Sequence[str], table: dict[str, dict], reference: tuple[float, float],
             exhaustive: float) -> list[float]:
    """HV fraction of the feasible front after each of the trials ``order`` lists (keys)."""
    seen: list[tuple[float, float]] = []
    curve = []
    for key in order:
        row = table[key]
        if row["feasible"]:
            seen.append((row["memory_saved"], row["instability"]))
            idx = pareto_indices(seen, DIRECTIONS)  # keep the running front small
            seen = [seen[i] for i in idx]
        curve.append(hypervolume(seen, DIRECTIONS, reference) / exhaustive)
    return curve


def single_draw_hits(rows: Sequence[dict], reference: tuple[float, float], exhaustive: float,
                     target: float) -> int:
    """How many policies reach ``target`` of the exhaustive HV on their own (how easy the table is)."""
    return sum(1 for r in rows if front_hv([r], reference) >= target * exhaustive)


# --------------------------------------------------------------------------- replay


def replay_optuna(sampler: optuna.samplers.BaseSampler, space: Space, table: dict[str, dict],
                  n_trials: int) -> list[str]:
    """Run an Optuna study that looks policies up in ``table``; return the keys it tried, in order.

    Each trial asks for its policy the way ``precsearch run`` does (``suggest_policy``), and gets
    the table's objectives and precsearch's stability constraint instead of a probe.
    """
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=sampler)
    order = []
    for _ in range(n_trials):
        trial = study.ask()
        suggest_policy(space, trial)
        row = table[param_key(trial.params)]
        trial.set_constraint("stability", _constraint(row, space.objectives.stability_limit))
        study.tell(trial, [row[name] for name in OBJECTIVES])
        order.append(param_key(trial.params))
    return order


def _constraint(row: dict, limit: float) -> float:
    """precsearch's constraint value (<= 0 when feasible), from a table row."""
    return DIVERGED_INSTABILITY if row["diverged"] else row["instability"] - limit


def sampler_orders(space: Space, table: dict[str, dict], seeds: Sequence[int], n_trials: int,
                   tpe_overrides: dict[str, Any] | None = None) -> dict[str, list[list[str]]]:
    """Trial orders per sampler and seed: precsearch's TPE, random search, grid and shuffled grid."""
    grid = [param_key(p) for p in enumerate_params(space)]
    orders: dict[str, list[list[str]]] = {"tpe": [], "random": [], "grid": [], "shuffled_grid": []}
    for seed in seeds:
        for name, kind in (("tpe", Sampler.TPE), ("random", Sampler.RANDOM)):
            sampler = make_sampler(StudySection(sampler=kind, seed=seed, n_trials=n_trials))
            if name == "tpe" and tpe_overrides:
                sampler = optuna.samplers.TPESampler(seed=seed, **tpe_overrides)
            t0 = time.perf_counter()
            orders[name].append(replay_optuna(sampler, space, table, n_trials))
            print(f"  {name} seed {seed}: {time.perf_counter() - t0:.1f} s", flush=True)
        orders["grid"].append(grid[:n_trials])  # the same fixed order for every seed
        shuffled = grid[:]
        random.Random(seed).shuffle(shuffled)
        orders["shuffled_grid"].append(shuffled[:n_trials])
    return orders


# --------------------------------------------------------------------------- summary


def trials_to_reach(curve: Sequence[float], target: float) -> int | None:
    """1-based trial count at which ``curve`` first reaches ``target`` (None if never)."""
    return next((i + 1 for i, v in enumerate(curve) if v >= target - 1e-12), None)


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.fmean(vals) for vals in zip(*curves)]


def summarize(curves: dict[str, list[list[float]]], orders: dict[str, list[list[str]]],
              table_size: int) -> dict[str, dict]:
    """Per sampler: HV fraction at each budget fraction, trials to targets, ratio vs random."""
    checkpoints = {f: max(1, round(f * table_size)) for f in FRACTIONS}
    random_at_10 = statistics.fmean(c[checkpoints[0.10] - 1] for c in curves["random"])
    targets = {"hv95": HV_TARGET, "random_hv_at_10pct": random_at_10}
    out: dict[str, dict] = {}
    for name, runs in curves.items():
        mean = mean_curve(runs)
        entry: dict[str, Any] = {"seeds": len(runs)}
        for f, n in checkpoints.items():
            vals = [c[n - 1] for c in runs]
            entry[f"hv_at_{round(100 * f)}pct"] = {"trials": n, "mean": statistics.fmean(vals), "min": min(vals)}
        for tname, target in targets.items():
            per_seed = [trials_to_reach(c, target) for c in runs]
            censored = [n if n is not None else len(runs[0]) + 1 for n in per_seed]  # never: budget + 1
            entry[f"trials_to_{tname}"] = {"target": target, "mean_curve": trials_to_reach(mean, target),
                                           "per_seed": per_seed, "per_seed_mean": statistics.fmean(censored),
                                           "per_seed_median": statistics.median(censored)}
        entry["unique_policies_at_budget"] = statistics.fmean(len(set(o)) for o in orders[name])
        out[name] = entry
    for tname in targets:
        base = out["random"][f"trials_to_{tname}"]["mean_curve"]
        for entry in out.values():
            mine = entry[f"trials_to_{tname}"]["mean_curve"]
            entry[f"trials_to_{tname}"]["random_over_this"] = (base / mine) if base and mine else None
    return out


def format_summary(summary: dict[str, dict], budget: int) -> str:
    """A plain-text table of :func:`summarize`'s output."""
    def cell(x: dict) -> str:
        return f"{100 * x['mean']:5.1f} / {100 * x['min']:5.1f}"

    def reach(x: dict) -> str:
        n = x["mean_curve"]
        ratio = x["random_over_this"]
        return (f">{budget}" if n is None else str(n)) + (f" (x{ratio:.2f})" if ratio else " (-)")

    first = next(iter(summary.values()))
    head = ["sampler"] + [f"HV% @{v['trials']} mean/min" for k, v in first.items() if k.startswith("hv_at_")]
    head += ["trials to 95% (random/x)", "trials to rnd@10% (random/x)", "unique"]
    lines = [" | ".join(head)]
    for name, e in summary.items():
        cells = [name] + [cell(v) for k, v in e.items() if k.startswith("hv_at_")]
        cells += [reach(e["trials_to_hv95"]), reach(e["trials_to_random_hv_at_10pct"]),
                  f"{e['unique_policies_at_budget']:.0f}"]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="the probe table's JSON cache")
    ap.add_argument("--seeds", type=int, default=20, help="replay seeds (replays are cheap: no probes)")
    ap.add_argument("--trials", type=int, help="trials per replay (default: half the table)")
    ap.add_argument("--tpe", type=json.loads, help="experiment: TPESampler kwargs instead of make_sampler's, "
                                                   "e.g. '{\"n_startup_trials\": 5, \"multivariate\": true}'")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()

    space = bench_space()
    table = build_table(space, args.cache)
    table_s = time.perf_counter() - start
    rows = list(table.values())
    ref = (0.0, space.objectives.stability_limit)
    exhaustive = front_hv(rows, ref)
    if exhaustive <= 0:
        print("the exhaustive feasible front has zero hypervolume: nothing to compare", file=sys.stderr)
        return 1
    n_trials = args.trials or len(rows) // 2
    easy = single_draw_hits(rows, ref, exhaustive, HV_TARGET)
    print(f"table: {len(rows)} policies, {sum(r['feasible'] for r in rows)} feasible, exhaustive HV "
          f"{exhaustive:.6g}; {easy} policies alone reach {100 * HV_TARGET:.0f}% of it "
          f"(one random draw hits with p = {easy / len(rows):.3f}); replaying {n_trials} trials x {args.seeds} seeds", flush=True)

    orders = sampler_orders(space, table, range(args.seeds), n_trials, args.tpe)
    curves = {name: [hv_curve(o, table, ref, exhaustive) for o in runs] for name, runs in orders.items()}
    summary = summarize(curves, orders, len(rows))
    print("memory saved: predicted by precsearch's memory model (CPU); HV% is of the exhaustive feasible front")
    print(format_summary(summary, n_trials))
    total_s = time.perf_counter() - start
    print(f"table {table_s:.0f} s, total {total_s:.0f} s")
    if args.json:
        _write_json(args, space, rows, exhaustive, ref, n_trials, orders, curves, summary, table_s, total_s)
    return 0


def _write_json(args, space: Space, rows: list[dict], exhaustive: float, ref: tuple[float, float],
                n_trials: int, orders, curves, summary, table_s: float, total_s: float) -> None:
    feasible_rows = [r for r in rows if r["feasible"]]
    index = {param_key(r["params"]): i for i, r in enumerate(rows)}
    payload = {
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "optuna": optuna.__version__},
        "memory_source": "predicted (precsearch's memory model; CPU has no measured peak memory)",
        "space": space.model_dump(mode="json"),
        "objectives": list(OBJECTIVES), "directions": list(DIRECTIONS),
        "hv_reference_point": list(ref), "exhaustive_hv": exhaustive,
        "exhaustive_front_params": [feasible_rows[i]["params"] for i in
                                    pareto_indices(feasible_points(feasible_rows), DIRECTIONS)],
        "single_draw_hits_95pct": single_draw_hits(rows, ref, exhaustive, HV_TARGET),
        "table_size": len(rows), "feasible": len(feasible_rows), "trials_per_replay": n_trials,
        "seeds": args.seeds, "tpe_overrides": args.tpe,
        "summary": summary,
        "curves": {name: [[round(v, 6) for v in c] for c in runs] for name, runs in curves.items()},
        "orders_as_table_indices": {name: [[index[k] for k in o] for o in runs] for name, runs in orders.items()},
        "table": rows, "table_build_s_this_run": table_s,
        "table_probe_s_total": sum(r["probe_wall_s"] for r in rows), "total_s": total_s,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=1, default=str))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    raise SystemExit(main())
