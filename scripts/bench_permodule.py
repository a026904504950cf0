"""Per-module search at probe scale: sensitivity-guided vs TPE, random and NSGA-II (CPU, emulated FP8).

The space gives each of a 4-block ``tiny`` probe's 16 block GEMMs and its output
layer its own precision (bf16, fp8_current, fp8_delayed: 3^17 = 129 million
policies), so no exhaustive table exists. Instead:

1. Probes are cached by policy (JSON on disk): a policy any method proposes is
   probed once, and a repeat costs nothing, as in ``precsearch run``.
2. Every method runs ``--budget`` probes per seed, as an Optuna study asking its
   policy with ``suggest_policy`` and told the probe's objectives and precsearch's
   stability constraint. ``guided`` is the sensitivity pass (once: the probe seed is
   fixed) plus the integer program's candidates queued with ``enqueue_trial``,
   then TPE; its curve starts after the pass's cost in probe-equivalents
   (its wall time over the median probe's). ``guided_shuffled`` is the control:
   the same, with the instability scores shuffled among the units (the memory
   column kept), which separates what the estimator adds from what knowing
   each unit's memory effect adds.
3. Reference hypervolume: the feasible front of every policy any method probed.
   Reported: HV fraction vs probes (mean and worst over seeds), probes to reach
   95% of the reference, and the target (guided reaches it in >= 2x fewer
   probes than TPE and than random).
4. Estimator quality: the 34 one-unit-switched policies are probed too (ground
   truth: the measured loss gap with only that unit switched); each estimator's
   scores are ranked against them (Spearman, Kendall).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import optuna
import torch
from scipy.stats import kendalltau, spearmanr

from precsearch.backends import get_backend
from precsearch.config.loader import parse_space
from precsearch.config.space import Sampler, Space, StudySection
from precsearch.config.unit_space import searched_units
from precsearch.policy import Policy
from precsearch.probe.data import load_batches
from precsearch.probe.runner import run_probe
from precsearch.probe.measure.sensitivity import train_bf16, unit_scores
from precsearch.search.candidates import sweep
from precsearch.search.hypervolume import hypervolume
from precsearch.search.pareto import pareto_indices
from precsearch.search.sampling import policy_from_params, suggest_policy
from precsearch.search.scoring import DIVERGED_INSTABILITY, score
from precsearch.search.sensitivity import SensitivityTable, measure
from precsearch.runtime.stores import make_sampler

PRECISIONS = ["bf16", "fp8_current", "fp8_delayed"]
DIRECTIONS = ("maximize", "minimize")
HV_TARGET = 0.95
METHODS = ("guided", "guided_shuffled", "tpe", "random", "nsga2")


def permodule_space(estimator: str = "forward", budgets: int = 8) -> Space:
    """The bench model of ``bench_search.bench_space`` with per-module units."""
    return parse_space({
        "model": {"preset": "tiny", "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "n_layers": 4},
        "data": {"source": "stdlib", "max_tokens": 200_000, "eval_batches": 2},
        "probe": {"steps": 30, "micro_batch": 4, "seq_len": 64, "lr": 3e-2, "seed": 0, "device": "cpu"},
        "backend": "emulated",
        "search": {"units": [{"precision": {"choices": PRECISIONS}},
                             {"modules": ["output_layer"], "precision": {"choices": PRECISIONS}}],
                   "sensitivity": {"estimator": estimator, "budgets": budgets, "eval_batches": 2},
                   "clip_grad": 1.0},
        "objectives": {"memory": True, "instability": True, "stability_limit": 0.01},
        "study": {"name": "bench_permodule", "sampler": "tpe", "seed": 0},
    }, file="<bench_permodule>")


def key(params: dict[str, Any]) -> str:
    """The cache key of a trial's params: their JSON with sorted keys."""
    return json.dumps(params, sort_keys=True)


class ProbeCache:
    """Objectives per policy, probed on first request and kept in a JSON file."""

    def __init__(self, space: Space, path: Path):
        self.space, self.path = space, path
        self.rows: dict[str, dict] = json.loads(path.read_text())["rows"] if path.exists() else {}
        self.device = torch.device("cpu")
        self.backend = get_backend("emulated", self.device)
        self.data = load_batches(space)
        self.reference = self._probe(Policy.bf16(1.0))
        self.new = 0

    def _probe(self, policy: Policy):
        return run_probe(self.space.model.probe(), self.space.probe, policy, self.data, self.backend, self.device)

    def get(self, params: dict[str, Any]) -> dict:
        """The scored row of ``params``' policy, probing it (and saving every 25 new ones) on first request."""
        k = key(params)
        if k not in self.rows:
            t0 = time.perf_counter()
            result = self._probe(policy_from_params(self.space, params))
            s = score(result, self.reference, self.space.objectives)
            self.rows[k] = {"params": params, "memory_saved": s.memory_saved, "instability": s.instability,
                            "loss_gap": s.loss_gap, "feasible": s.feasible, "diverged": s.diverged,
                            "probe_wall_s": round(time.perf_counter() - t0, 3)}
            self.new += 1
            if self.new % 25 == 0:
                self.save()
        return self.rows[k]

    def save(self) -> None:
        """Write the cache atomically (a temporary file, then rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rows": self.rows}))
        os.replace(tmp, self.path)


def run_method(sampler: optuna.samplers.BaseSampler, space: Space, cache: ProbeCache, budget: int,
               queued: list[dict[str, str]] = ()) -> list[str]:
    """The policies (keys) an Optuna study probes in ``budget`` trials, queued ones first."""
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=sampler)
    for params in queued:
        study.enqueue_trial(params, skip_if_exists=True)
    order = []
    for _ in range(budget):
        trial = study.ask()
        suggest_policy(space, trial)
        row = cache.get(trial.params)
        limit = space.objectives.stability_limit
        trial.set_constraint("stability", DIVERGED_INSTABILITY if row["diverged"] else row["instability"] - limit)
        study.tell(trial, [row["memory_saved"], row["instability"]])
        order.append(key(trial.params))
    return order


def hv_curve(order: list[str], rows: dict[str, dict], ref: tuple[float, float], best: float,
             offset: int = 0) -> list[float]:
    """HV fraction after each probe; ``offset`` probes of zero HV first (a method's up-front cost)."""
    seen: list[tuple[float, float]] = []
    curve = [0.0] * offset
    for k in order:
        r = rows[k]
        if r["feasible"]:
            seen.append((r["memory_saved"], r["instability"]))
            seen = [seen[i] for i in pareto_indices(seen, DIRECTIONS)]
        curve.append(hypervolume(seen, DIRECTIONS, ref) / best)
    return curve


def probes_to(curve: list[float], target: float) -> int | None:
    """Probes until ``curve`` first reaches ``target`` (1-based), or None if it never does."""
    return next((i + 1 for i, v in enumerate(curve) if v >= target - 1e-12), None)


def estimator_quality(space: Space, cache: ProbeCache) -> dict[str, Any]:
    """Rank correlation of each estimator's one-unit scores with one-unit-switched probes."""
    cfg = space.model.probe()
    units = searched_units(space.search.units, cfg.n_layers)
    base = {u.param: "bf16" for u in units}
    truth = {(u.unit, p): cache.get(base | {u.param: p})["loss_gap"] for u in units for p in PRECISIONS[1:]}
    model = train_bf16(cfg, space.probe, cache.data, cache.device, 1.0)
    from precsearch.precision import LayerRecipe, Precision

    out: dict[str, Any] = {"ground_truth_loss_gap": {f"{u}|{p}": v for (u, p), v in truth.items()}}
    for est in ("forward", "taylor"):
        t0 = time.perf_counter()
        scores = unit_scores(est, model, [u.unit for u in units], [Precision(p) for p in PRECISIONS],
                             LayerRecipe(), cache.data.eval_set()[:2], cache.device)
        pairs = [(scores[u, Precision(p)], truth[u, p]) for (u, p) in truth]
        xs, ys = zip(*pairs)
        out[est] = {"spearman": float(spearmanr(xs, ys).statistic), "kendall": float(kendalltau(xs, ys).statistic),
                    "score_s": time.perf_counter() - t0, "scores": {f"{u}|{p}": scores[u, Precision(p)]
                                                                    for (u, p) in truth}}
    return out


def shuffled(table: SensitivityTable, seed: int) -> SensitivityTable:
    """The control: the same table with its low-precision instability scores shuffled among the rows (memory
    kept), so the integer program still knows what each unit saves but not which unit is sensitive."""
    low = [i for i, r in enumerate(table.rows) if r.precision != "bf16"]
    scores = [table.rows[i].predicted_instability for i in low]
    random.Random(seed).shuffle(scores)
    rows = list(table.rows)
    for i, v in zip(low, scores):
        rows[i] = replace(rows[i], predicted_instability=v)
    return SensitivityTable(table.estimator, rows, table.wall_s)


def samplers(seed: int, budget: int) -> dict[str, Callable[[], optuna.samplers.BaseSampler]]:
    """Method -> a factory of its sampler; both guided arms are TPE after their queued candidates."""
    section = lambda kind: StudySection(sampler=kind, seed=seed, n_trials=budget)  # noqa: E731
    return {"guided": lambda: make_sampler(section(Sampler.TPE)),
            "guided_shuffled": lambda: make_sampler(section(Sampler.TPE)),
            "tpe": lambda: make_sampler(section(Sampler.TPE)),
            "random": lambda: make_sampler(section(Sampler.RANDOM)),
            "nsga2": lambda: make_sampler(section(Sampler.NSGA2))}


def run(cache_path: Path, seeds: int, budget: int, say: Callable[[str], None] = print,
        max_s: float = math.inf) -> dict[str, Any]:
    """The whole per-module benchmark; returns the JSON payload. No seed starts after ``max_s`` seconds
    (the payload's ``seeds`` says how many ran)."""
    space = permodule_space()
    cache = ProbeCache(space, cache_path)
    t0 = time.perf_counter()
    table = measure(space, cache.data, cache.device)
    pass_s = time.perf_counter() - t0
    candidates = sweep(table, space.search.sensitivity.budgets)
    say(f"sensitivity pass {pass_s:.1f} s, {len(candidates)} candidates")
    quality = estimator_quality(space, cache)
    say(f"estimator vs one-unit probes: forward spearman {quality['forward']['spearman']:.3f}, "
        f"taylor spearman {quality['taylor']['spearman']:.3f}")
    orders: dict[str, list[list[str]]] = {m: [] for m in METHODS}
    for seed in range(seeds):
        if time.perf_counter() - t0 > max_s:
            say(f"time limit: stopping after {seed} seeds")
            seeds = seed
            break
        for name, make in samplers(seed, budget).items():
            queued = {"guided": [c.params for c in candidates],
                      "guided_shuffled": [c.params for c in sweep(shuffled(table, seed),
                                                                   space.search.sensitivity.budgets)]}.get(name, [])
            orders[name].append(run_method(make(), space, cache, budget, queued))
        cache.save()
        say(f"seed {seed}: {len(cache.rows)} policies probed so far, {time.perf_counter() - t0:.0f} s")
    probe_s = statistics.median(r["probe_wall_s"] for r in cache.rows.values())
    offset = math.ceil(pass_s / probe_s)
    return summarize(space, cache, orders, offset, pass_s, probe_s, candidates, quality, seeds, budget)


def summarize(space, cache, orders, offset, pass_s, probe_s, candidates, quality, seeds, budget) -> dict[str, Any]:
    """The JSON payload: HV curves against the front of every policy probed, probes to 95%, the target verdict.

    The guided arms' curves start with ``offset`` zero-HV probes (their sensitivity pass) and are cut at
    ``budget`` like the others, so they get fewer real probes in the same budget.
    """
    ref = (0.0, space.objectives.stability_limit)
    probed = {k for runs in orders.values() for o in runs for k in o}
    feasible = [cache.rows[k] for k in probed if cache.rows[k]["feasible"]]
    best = hypervolume([(r["memory_saved"], r["instability"]) for r in feasible], DIRECTIONS, ref)
    curves = {m: [hv_curve(o, cache.rows, ref, best, offset if m.startswith("guided") else 0)[:budget] for o in runs]
              for m, runs in orders.items()}
    summary = {}
    for m, runs in curves.items():
        mean = [statistics.fmean(v) for v in zip(*runs)]
        worst = [min(v) for v in zip(*runs)]
        per_seed = [probes_to(c, HV_TARGET) for c in runs]
        summary[m] = {"probes_to_95_mean_curve": probes_to(mean, HV_TARGET),
                      "probes_to_95_worst_curve": probes_to(worst, HV_TARGET), "per_seed": per_seed,
                      "hv_at": {n: {"mean": mean[n - 1], "worst": worst[n - 1]} for n in (5, 10, 20, budget)
                                if n <= budget},
                      "mean_curve": mean, "worst_curve": worst}
    g = summary["guided"]["probes_to_95_mean_curve"]
    ratios = {m: (summary[m]["probes_to_95_mean_curve"] or budget + 1) / g if g else None for m in ("tpe", "random")}
    return {"space": space.model_dump(mode="json"), "seeds": seeds, "budget_per_seed": budget,
            "reference_hv": best, "reference_point": list(ref), "policies_probed": len(cache.rows),
            "policies_in_reference": len(probed),
            "sensitivity_pass_s": pass_s, "median_probe_s": probe_s, "guided_offset_probes": offset,
            "candidates": [c.__dict__ for c in candidates], "estimator_quality": quality, "summary": summary,
            "ratio_vs_guided_probes_to_95": ratios,
            "target_met": all(r is not None and r >= 2 for r in ratios.values()),
            "curves": curves, "orders": orders}


def format_table(payload: dict[str, Any]) -> str:
    """Probes to 95% of the reference HV, and HV% at fixed probe counts (mean / worst over seeds)."""
    summary, budget = payload["summary"], payload["budget_per_seed"]
    points = list(next(iter(summary.values()))["hv_at"])
    head = ["method", "probes to 95% (mean curve)", "(worst curve)", "seeds reaching 95%"]
    head += [f"HV% @{n} mean/worst" for n in points]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for m, e in summary.items():
        reach = lambda n: f">{budget}" if n is None else str(n)  # noqa: E731
        hits = sum(n is not None for n in e["per_seed"])
        cells = [m, reach(e["probes_to_95_mean_curve"]), reach(e["probes_to_95_worst_curve"]),
                 f"{hits}/{len(e['per_seed'])}"]
        cells += [f"{100 * v['mean']:.1f} / {100 * v['worst']:.1f}" for v in e["hv_at"].values()]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def plot(payload: dict[str, Any], path: Path) -> None:
    """HV fraction vs probes: mean (solid) and worst (dashed) over seeds, per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for m, e in payload["summary"].items():
        xs = range(1, len(e["mean_curve"]) + 1)
        line, = ax.plot(xs, e["mean_curve"], label=f"{m} (mean)")
        ax.plot(xs, e["worst_curve"], "--", color=line.get_color(), alpha=0.7, label=f"{m} (worst)")
    ax.axhline(HV_TARGET, color="grey", lw=0.8)
    ax.set_xlabel("probes (guided: its sensitivity pass counted as probes up front)")
    ax.set_ylabel("HV / reference HV")
    ax.set_title(f"per-module space (3^17 policies), {payload['seeds']} seeds, CPU emulated FP8", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(cache: Path, seeds: int, budget: int, max_minutes: float, json_path: Path | None) -> int:
    """Run, print the table and the target, write the JSON and the PNG beside it."""
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()
    payload = run(cache, seeds, budget, lambda m: print(m, flush=True), max_s=60 * max_minutes)
    payload |= {"date": datetime.date.today().isoformat(), "total_s": time.perf_counter() - start,
                "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": 1},
                "versions": {"torch": torch.__version__, "optuna": optuna.__version__},
                "memory_source": "predicted (precsearch's memory model; CPU has no measured peak memory)"}
    q = payload["estimator_quality"]
    print(f"reference HV {payload['reference_hv']:.6g}: front of the {payload['policies_in_reference']} policies the "
          f"methods probed ({payload['policies_probed']} probed in all, one-unit switches included); "
          f"sensitivity pass {payload['sensitivity_pass_s']:.1f} s = {payload['guided_offset_probes']} probes")
    print(f"estimators vs one-unit-switched probes (34): forward Spearman {q['forward']['spearman']:.3f} "
          f"Kendall {q['forward']['kendall']:.3f}; taylor Spearman {q['taylor']['spearman']:.3f} "
          f"Kendall {q['taylor']['kendall']:.3f}")
    print(format_table(payload))
    ratios = payload["ratio_vs_guided_probes_to_95"]
    print(f"target (guided reaches 95% in >= 2x fewer probes than tpe and random): "
          f"{'MET' if payload['target_met'] else 'NOT MET'} (tpe/guided {ratios['tpe']}, random/guided "
          f"{ratios['random']}); total {payload['total_s']:.0f} s")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(payload, indent=1, default=str))
        plot(payload, json_path.with_suffix(".png"))
        print(f"wrote {json_path} and {json_path.with_suffix('.png')}")
    return 0
