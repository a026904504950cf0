"""Trials per hour with 1 worker vs several, on one study space, side by side.

Runs ``precsearch run SPACE`` once per configuration (each in its own output
directory, so each is a fresh study), then reads the study and its MLflow
store back: trials per hour (wall clock, start-up included), per GPU or
worker, and the checks that matter for parallel runs: no trial lost (every
trial COMPLETE or failed by its own probe) and none duplicated (exactly one
MLflow run per trial).

    python scripts/bench_parallel.py SPACE --n-trials 8 --gpus 0 all --out results/   # GPU machine
    python scripts/bench_parallel.py search_spaces/cpu_smoke.yaml --n-trials 6 --workers 1 3   # CPU

Trials per hour are given twice: over the whole wall time, and "steady"
(after each worker's first trial, which pays the imports and the BF16
references). The per-unit efficiency is each configuration's steady rate per
GPU (or worker) over the first configuration's (run it with one unit): 1.0 is
perfect scaling. Prints a table and writes ``bench_parallel.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _configs(args) -> list[tuple[str, list[str], int]]:
    """(label, extra CLI args, number of GPUs or workers) per configuration."""
    if args.gpus:
        import torch

        out = []
        for g in args.gpus:
            n = torch.cuda.device_count() if g == "all" else len(g.split(","))
            out.append((f"gpus={g}", ["--gpus", g], n))
        return out
    return [(f"workers={w}", ["--workers", str(w)], w) for w in args.workers]


def _check(out_dir: Path) -> dict:
    import optuna
    from mlflow.tracking import MlflowClient

    from precsearch.runtime.study import finished_count
    from precsearch.runtime.workspace import Workspace

    ws = Workspace.load(out_dir)
    study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name(ws.experiment)
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=5000)
            if r.data.tags.get("precsearch.role") == "trial"]
    per_trial = Counter(int(r.data.tags["trial_number"]) for r in runs)
    states = Counter(t.state.name for t in study.trials)
    lost = sum(1 for t in study.trials if t.state.name in ("RUNNING", "WAITING")
               or (t.state.name == "FAIL" and "fail_reason" not in t.user_attrs and "not_needed" not in t.user_attrs
                   and not any(u.system_attrs.get("failed_trial") == t.number for u in study.trials)))
    probe_s = [t.user_attrs["probe_result"]["wall_s"] for t in study.trials if "probe_result" in t.user_attrs]
    ends = sorted(t.datetime_complete.timestamp() for t in study.trials if t.datetime_complete)
    return {"finished": finished_count(study), "states": dict(states), "lost": lost,
            "duplicated": sum(c - 1 for c in per_trial.values() if c > 1),
            "trials_without_run": sum(1 for t in study.trials if per_trial[t.number] == 0),
            "workers": len({json.dumps(t.user_attrs.get("worker", {}).get("pid")) for t in study.trials}),
            "median_probe_s": sorted(probe_s)[len(probe_s) // 2] if probe_s else None, "completions": ends}


def _steady_rate(ends: list[float], units: int) -> float | None:
    """Trials per hour after each unit's first trial (start-up, imports and references excluded)."""
    if len(ends) <= units:
        return None
    return (len(ends) - units) / (ends[-1] - ends[units - 1]) * 3600


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("--n-trials", type=int, default=8)
    parser.add_argument("--gpus", nargs="+", help="configurations of --gpus, e.g. 0 all")
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 3], help="CPU: configurations of --workers")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-parallel")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for label, extra, n in _configs(args):
        out_dir = args.out / label.replace("=", "_").replace(",", "-")
        cmd = [sys.executable, "-m", "precsearch", "run", str(args.space), "--n-trials", str(args.n_trials),
               "--output-dir", str(out_dir), "--no-progress", *extra]
        start = time.perf_counter()
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        code = subprocess.call(cmd, env=dict(os.environ, PYTHONPATH=path))
        wall = time.perf_counter() - start
        row = {"config": label, "parallel": n, "exit": code, "wall_s": wall} | _check(out_dir)
        row["trials_per_hour"] = row["finished"] / wall * 3600
        row["trials_per_hour_per_unit"] = row["trials_per_hour"] / n
        row["steady_trials_per_hour"] = _steady_rate(row["completions"], n)
        rows.append(row)
    base = rows[0]["trials_per_hour"]
    steady_base = (rows[0]["steady_trials_per_hour"] or 0) / rows[0]["parallel"]
    for r in rows:
        steady = r["steady_trials_per_hour"]
        r["steady_efficiency"] = steady / r["parallel"] / steady_base if steady and steady_base else None
    print(f"\n{'config':<12} {'units':>5} {'wall s':>8} {'trials':>6} {'trials/h':>9} {'per unit':>9} "
          f"{'speedup':>8} {'steady/h':>9} {'eff':>5} {'lost':>5} {'dup':>4} {'no run':>6} {'probe s':>8}")
    for r in rows:
        eff = f"{r['steady_efficiency']:.2f}" if r["steady_efficiency"] is not None else "-"
        print(f"{r['config']:<12} {r['parallel']:>5} {r['wall_s']:>8.1f} {r['finished']:>6} "
              f"{r['trials_per_hour']:>9.1f} {r['trials_per_hour_per_unit']:>9.1f} "
              f"{r['trials_per_hour'] / base:>7.2f}x {r['steady_trials_per_hour'] or 0:>9.1f} {eff:>5} "
              f"{r['lost']:>5} {r['duplicated']:>4} "
              f"{r['trials_without_run']:>6} {r['median_probe_s'] or 0:>8.1f}")
    (args.out / "bench_parallel.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["exit"] == 0 and r["lost"] == 0 and r["duplicated"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
