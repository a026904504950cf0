"""Where a study's time goes: a real ``precsearch run`` split into start-up, references and probe steps.

The probe's speed against a plain Transformer Engine stack is ``benchmarks/bench_stack.py``.
This script runs a study of ``--trials`` trials in a subprocess and splits its
wall time, with the trials' ``probe_result.json`` phases and MLflow run times,
into start-up, build, BF16 reference, warm-up and measured steps, eval, logging
+ other and teardown. Targets: at least 70% of the wall time after start-up in
probe steps (issue 13), fixed overhead per trial <= 10%.

    python benchmarks/bench_probe.py search_spaces/llama3_8b_h100.yaml --trials 16 --json out.json
    python benchmarks/bench_probe.py --smoke --json /tmp/bench_probe.json   # CPU, tiny space, < 3 minutes

``--compare`` runs the same study twice back to back, BEFORE (``PRECSEARCH_SYNC_RECORD=1``: each
trial's MLflow record and front update inline on the probe loop, as before the recorder thread; on
CPU also torch's old default of one thread per core) and AFTER (the defaults), and prints the two
breakdowns side by side with trials per GPU-hour (3600 x trials / the process's wall time):

    python benchmarks/bench_probe.py search_spaces/llama3_8b_h100.yaml --trials 16 --compare \
        --json benchmarks/results/<date>_h200_bench_probe_compare.json

Where the two studies do not fit one call (a device call's 10 minutes), ``--only before`` and ``--only after``
run one each (same space and trials; each JSON holds its breakdown under ``compare``), and ``--merge`` prints
and writes the side-by-side comparison of the two files (the two ran in separate processes, on one kind of
machine, not back to back):

    python benchmarks/bench_probe.py SPACE --trials 16 --only before --json before.json     # device call 1
    python benchmarks/bench_probe.py SPACE --trials 16 --only after --json after.json       # device call 2
    python benchmarks/bench_probe.py --merge before.json after.json --json compare.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from precsearch.backends import resolve_device
from precsearch.runtime.evaluate import te_version
from precsearch.config.loader import parse_space
from precsearch.config.space import Space
from precsearch.runtime.timeline import format_table, probe_time
from precsearch.utils import trace

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
DEFAULT_SPACE = Path("search_spaces/llama3_8b_h100.yaml")


# ---------------------------------------------------------------- spaces

def smoke_space_dict() -> dict:
    """``search_spaces/cpu_smoke.yaml``: a 2-layer, 64-wide CPU space that a 2-trial study runs in seconds."""
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "search_spaces" / "cpu_smoke.yaml").read_text())
    data["study"] |= {"name": "bench-probe-smoke", "n_trials": 2}
    return data


def with_steps(data: dict, steps: int | None) -> dict:
    """A copy of the space data with ``probe.steps`` overridden (LR warm-up kept below it)."""
    data = copy.deepcopy(data)
    if steps:
        probe = data.setdefault("probe", {})
        probe["steps"] = steps
        probe["lr_warmup_steps"] = min(probe.get("lr_warmup_steps", 5), max(0, steps - 1))
    return data


def load_space_data(path: Path, smoke: bool, steps: int | None) -> dict:
    """The space as plain data: the smoke space or the file's, with the step override applied."""
    data = smoke_space_dict() if smoke else yaml.safe_load(path.read_text())
    return with_steps(data, steps)


# ---------------------------------------------------------------- part 2: trial wall time

def time_startup(cuda: bool) -> dict[str, float]:
    """A fresh process that only imports what ``precsearch run`` needs and initialises CUDA."""
    code = (
        "import time, json; t0 = time.perf_counter()\n"
        "import precsearch.cli, torch, optuna, mlflow\n"
        "try:\n    import transformer_engine.pytorch\nexcept Exception:\n    pass\n"
        "t1 = time.perf_counter()\n"
        + ("torch.cuda.init(); torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n" if cuda else "")
        + "print(json.dumps({'imports_s': t1 - t0, 'cuda_init_s': time.perf_counter() - t1}))\n"
    )
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    wall = time.time() - t0
    inner = json.loads(out.strip().splitlines()[-1])
    return {"process_s": wall, **inner, "interpreter_s": wall - inner["imports_s"] - inner["cuda_init_s"]}


def run_study_process(space_path: Path, n_trials: int, out_dir: Path,
                      env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, float]:
    """``precsearch run`` in a subprocess (from ``cwd``: ``python -m`` imports the package found there first);
    its start and end (epoch seconds). Raises with its log on failure."""
    cmd = [sys.executable, "-m", "precsearch", "run", str(space_path.resolve()), "--n-trials", str(n_trials),
           "--output-dir", str(out_dir.resolve()), "--no-progress"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    t1 = time.time()
    (out_dir / "bench_study.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return t0, t1


def trial_runs(out_dir: Path) -> list[dict]:
    """Each trial's MLflow run: number, start/end (s), status, duplicate_of, probe_result (or None)."""
    from mlflow.tracking import MlflowClient

    manifest = json.loads((out_dir / "precsearch.json").read_text())
    client = MlflowClient(tracking_uri=manifest["tracking_uri"])
    experiment = client.get_experiment_by_name(manifest["experiment"])
    runs = client.search_runs([experiment.experiment_id], "tags.`precsearch.role` = 'trial'")
    rows = []
    for run in runs:
        info, tags = run.info, run.data.tags
        rows.append({"trial": int(tags["trial_number"]), "start": info.start_time / 1000,
                     "end": info.end_time / 1000, "status": info.status,
                     "duplicate_of": tags.get("duplicate_of", "-"),
                     "probe_result": _artifact_json(client, info.run_id, "probe_result.json", out_dir)})
    return sorted(rows, key=lambda r: r["start"])


def _artifact_json(client: Any, run_id: str, name: str, out_dir: Path) -> dict | None:
    """A run's JSON artifact, or None when the run has none (a failed trial)."""
    if name not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    dst = Path(tempfile.mkdtemp(dir=out_dir))
    return json.loads(Path(client.download_artifacts(run_id, name, str(dst))).read_text())


def reference_walls(out_dir: Path) -> float:
    """Seconds the study's BF16 reference probe(s) took (all run inside some trial's MLflow run)."""
    return sum(json.loads(p.read_text()).get("wall_s", 0.0) for p in (out_dir / "references").glob("*.json"))


def breakdown(t0: float, t1: float, runs: list[dict], ref_s: float, startup: dict[str, float]) -> dict[str, float]:
    """Seconds per component over the whole process (they add up to its wall time)."""
    first, last = runs[0]["start"], runs[-1]["end"]
    phases = {"build": 0.0, "warmup_steps": 0.0, "measured_steps": 0.0, "eval": 0.0, "reading_bf16": 0.0,
              "reading": 0.0}
    for r in runs:
        result = (r["probe_result"] or {}) if r["duplicate_of"] == "-" else {}
        ph = result.get("phase_s", {})
        phases["build"] += ph.get("build", 0.0)
        phases["warmup_steps"] += ph.get("warmup_steps", 0.0)
        phases["measured_steps"] += ph.get("fp8_steps", 0.0) + ph.get("bf16_steps", 0.0)
        phases["eval"] += ph.get("eval", 0.0)
        read = result.get("damage") or {}  # the fixed-state reading (objectives.reading: damage)
        parts = sum((read.get("seconds_by_part") or {}).values())
        phases["reading"] += parts
        phases["reading_bf16"] += read.get("seconds", 0.0) - parts  # its BF16 side, paid once per clip value
    trials_span = last - first  # the trials' runs and the gaps between them (front update, Optuna tell)
    imports = min(startup["process_s"], first - t0)
    return {
        "startup: process + imports + CUDA init": imports,
        "startup: study setup (storage, data, MLflow)": first - t0 - imports,
        "model build": phases["build"],
        "BF16 reference": ref_s,
        "warm-up steps": phases["warmup_steps"],
        "measured steps": phases["measured_steps"],
        "eval": phases["eval"],
        "fixed-state reading: BF16 side": phases["reading_bf16"],
        "fixed-state reading": phases["reading"],
        "logging + other": trials_span - ref_s - sum(phases.values()),
        "teardown": t1 - last,
    }


#: Components paid once per ``precsearch run`` (or per reference key), not once per trial.
PER_PROCESS = ("startup: process + imports + CUDA init", "startup: study setup (storage, data, MLflow)",
               "BF16 reference", "fixed-state reading: BF16 side", "teardown")


def overhead_at(totals: dict[str, float], n_run: int, n_target: int) -> float:
    """Fixed-overhead share of a trial if the same study ran ``n_target`` trials instead of ``n_run``."""
    per_trial = {k: v / (n_target if k in PER_PROCESS else n_run) for k, v in totals.items()}
    return 1 - (per_trial["warm-up steps"] + per_trial["measured steps"]) / sum(per_trial.values())


def trial_breakdown(space_data: dict, n_trials: int, work: Path, device: torch.device,
                    env: dict[str, str] | None = None, code: Path | None = None) -> dict[str, Any]:
    """Run the study (in ``env``), time a start-up-only process, and split the mean trial's wall time."""
    work.mkdir(parents=True, exist_ok=True)
    space_path = work / "space.yaml"
    space_path.write_text(yaml.safe_dump(space_data, sort_keys=False))
    out_dir = work / "study"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    startup = time_startup(device.type == "cuda")
    print(f"done: start-up process {startup['process_s']:.1f}s", file=sys.stderr, flush=True)
    trace_path = out_dir / "trace.jsonl"  # code that writes no trace (an older checkout) leaves no file
    env = dict(os.environ if env is None else env) | {trace.ENV: str(trace_path)} | cold_compile_caches(out_dir)
    t0, t1 = run_study_process(space_path, n_trials, out_dir, env, cwd=code)
    print(f"done: {n_trials}-trial study {t1 - t0:.1f}s", file=sys.stderr, flush=True)
    timeline = probe_time(trace.read(trace_path), t0, t1) if trace_path.is_file() else None
    runs = trial_runs(out_dir)
    totals = breakdown(t0, t1, runs, reference_walls(out_dir), startup)
    per_trial = {k: v / len(runs) for k, v in totals.items()}
    steps = per_trial["warm-up steps"] + per_trial["measured steps"]
    trial_s = (t1 - t0) / len(runs)
    after_startup = (t1 - t0) - sum(v for k, v in totals.items() if k.startswith("startup"))
    step_s = totals["warm-up steps"] + totals["measured steps"]
    return {"process_wall_s": t1 - t0, "n_trials": len(runs), "trial_s": trial_s, "per_trial_s": per_trial,
            "trials_per_gpu_hour": 3600 * len(runs) / (t1 - t0),
            "after_startup_s": after_startup, "steps_share_after_startup": step_s / after_startup,
            "steps_and_reference_share_after_startup": (step_s + totals["BF16 reference"]) / after_startup,
            "probe_work_share_after_startup": (step_s + totals["BF16 reference"] + totals["fixed-state reading"]
                                               + totals["fixed-state reading: BF16 side"]) / after_startup,
            "fixed_overhead_share": 1 - steps / trial_s, "startup_process": startup,
            "study_n_trials": space_data.get("study", {}).get("n_trials", n_trials),
            "fixed_overhead_share_at_study_n_trials": overhead_at(
                totals, len(runs), space_data.get("study", {}).get("n_trials", n_trials)),
            "probe_process_s": timeline,
            "trials": [{k: v for k, v in r.items() if k != "probe_result"} | {"phase_s": (r["probe_result"] or {})
                        .get("phase_s")} for r in runs], "output_dir": str(out_dir),
            "code": str(code) if code is not None else "this checkout"}


def cold_compile_caches(out_dir: Path) -> dict[str, str]:
    """torch.compile's caches (Inductor's and Triton's) in ``out_dir``, which each study starts empty: run back to
    back on one machine, the second study would otherwise find the first one's compiled kernels on disk (on the
    H200, 2026-12-05, the first trial's two compare steps took 3.95 and 2.51 s in the first study and 0.77 and
    0.64 s in the second, the same compare code), and a BEFORE/AFTER pair would credit the code after with them."""
    cache = out_dir / "compile_cache"
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}


def print_breakdown(b: dict[str, Any]) -> None:
    """The wall-time table of the mean trial."""
    print(f"\n[2] trial wall time: {b['n_trials']}-trial study, {b['process_wall_s']:.1f}s in all, "
          f"{b['trial_s']:.2f}s per trial (fixed costs spread over the trials)")
    print(f"{'component':46s} {'s/trial':>9} {'share':>7}")
    for name, s in b["per_trial_s"].items():
        print(f"{name:46s} {s:9.2f} {100 * s / b['trial_s']:6.1f}%")
    su = b["startup_process"]
    print(f"  (start-up-only process: {su['process_s']:.1f}s = interpreter {su['interpreter_s']:.1f}s "
          f"+ imports {su['imports_s']:.1f}s + CUDA init {su['cuda_init_s']:.1f}s)")
    print(f"probe steps: {100 * b['steps_share_after_startup']:.1f}% of the wall time after start-up "
          f"({100 * b['steps_and_reference_share_after_startup']:.1f}% counting the BF16 reference probes, "
          f"{100 * b['probe_work_share_after_startup']:.1f}% with the fixed-state readings)  "
          f"target >= 70%  {'ok' if b['steps_share_after_startup'] >= 0.70 else 'BELOW'}")
    share = b["fixed_overhead_share"]
    print(f"fixed overhead (all but warm-up + measured steps): {100 * share:.1f}% of a trial  "
          f"target <= 10%  {'ok' if share <= 0.10 else 'ABOVE'}")
    print(f"  same costs spread over the space's study.n_trials = {b['study_n_trials']}: "
          f"{100 * b['fixed_overhead_share_at_study_n_trials']:.1f}%")
    if b.get("probe_process_s"):
        print_timeline(b["probe_process_s"], b["process_wall_s"])


def print_timeline(parts: dict[str, float], wall: float) -> None:
    """The probe process's time (it holds the GPU): its requests' parts, and what it waited for."""
    print("\n[3] from the run's trace, " + format_table(parts, wall))


# ---------------------------------------------------------------- before / after

def variant_env(variant: str, device: torch.device, before_code: Path | None = None) -> dict[str, str]:
    """The environment of the BEFORE (inline records; CPU: a thread per core) or AFTER (defaults) study; with
    ``before_code`` (another checkout) BEFORE runs that code with the defaults, its tree first on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PRECSEARCH_SYNC_RECORD", "PRECSEARCH_CPU_THREADS")}
    if variant == "before" and before_code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(before_code), env.get("PYTHONPATH", "")]))
    elif variant == "before":
        env["PRECSEARCH_SYNC_RECORD"] = "1"
        if device.type == "cpu" and "OMP_NUM_THREADS" not in env:
            env["PRECSEARCH_CPU_THREADS"] = str(len(os.sched_getaffinity(0)))  # torch's own default
    return env


VARIANTS = ("before", "after")


def compare(space_data: dict, n_trials: int, work: Path, device: torch.device,
            variants: tuple[str, ...] = VARIANTS, before_code: Path | None = None,
            before_space: dict | None = None) -> dict[str, Any]:
    """The study BEFORE and AFTER, back to back in this one call, and the ratios of the two (``variants``
    one of them: its breakdown alone, for :func:`merge`). ``before_code``: BEFORE is that checkout's code;
    ``before_space``: BEFORE runs this space (the shipped file as it was) instead of ``space_data``."""
    spaces = {"before": before_space or space_data, "after": space_data}
    runs = {v: trial_breakdown(spaces[v], n_trials, work / v, device, variant_env(v, device, before_code),
                               before_code if v == "before" else None) for v in variants}
    return ratios(runs) if len(runs) == 2 else runs


def ratios(runs: dict[str, Any]) -> dict[str, Any]:
    """``runs`` (before and after) with the after/before ratios of trials per GPU-hour and time per trial."""
    before, after = runs["before"], runs["after"]
    return runs | {"trials_per_gpu_hour_ratio": after["trials_per_gpu_hour"] / before["trials_per_gpu_hour"],
                   "trial_s_ratio": after["trial_s"] / before["trial_s"]}


def print_compare(c: dict[str, Any]) -> None:
    """The two breakdowns side by side."""
    before, after = c["before"], c["after"]
    what = (f"the code of {before['code']}" if before.get("code", "this checkout") != "this checkout"
            else "inline records")
    print(f"\n[compare] {before['n_trials']}-trial study, BEFORE ({what}) vs AFTER (this checkout)")
    print(f"{'component':46s} {'before s/trial':>15} {'after s/trial':>14}")
    for name in before["per_trial_s"]:
        print(f"{name:46s} {before['per_trial_s'][name]:15.2f} {after['per_trial_s'][name]:14.2f}")
    print(f"{'wall time per trial':46s} {before['trial_s']:15.2f} {after['trial_s']:14.2f}")
    for key, label in (("steps_share_after_startup", "probe steps, share after start-up"),
                       ("steps_and_reference_share_after_startup", "  with the BF16 references"),
                       ("probe_work_share_after_startup", "  and the fixed-state readings")):
        print(f"{label:46s} {100 * before[key]:14.1f}% {100 * after[key]:13.1f}%")
    print(f"{'trials per GPU-hour':46s} {before['trials_per_gpu_hour']:15.0f} {after['trials_per_gpu_hour']:14.0f}"
          f"   x{c['trials_per_gpu_hour_ratio']:.2f}  (target >= 1.6x)")


def merge(paths: list[Path]) -> dict[str, Any]:
    """One report from an ``--only before`` and an ``--only after`` JSON: both breakdowns and their ratios,
    the settings checked to be the same study."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    runs = {}
    for path, r in zip(paths, reports):
        for variant, b in r.get("compare", {}).items():
            if variant in VARIANTS:
                if variant in runs:
                    raise SystemExit(f"--merge: {path} holds a second {variant!r} study")
                runs[variant] = b
    if set(runs) != set(VARIANTS):
        raise SystemExit(f"--merge needs one 'before' and one 'after' study, got {sorted(runs) or 'none'}")
    keys = ("space", "steps", "n_trials", "probe", "backend")
    first, second = ({k: r["meta"]["settings"].get(k) for k in keys} for r in reports)
    if first != second:
        raise SystemExit(f"--merge: the two studies differ in their settings: {first} vs {second}")
    return {"meta": reports[0]["meta"] | {"merged_from": [str(p) for p in paths],
                                         "dates": [r["meta"]["date"] for r in reports]},
            "compare": ratios(runs)}


# ---------------------------------------------------------------- main

def meta(args: argparse.Namespace, space: Space, device: torch.device) -> dict[str, Any]:
    """Date, hardware, versions and settings for the JSON report."""
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {platform.machine()}",
            "torch": torch.__version__, "transformer_engine": te_version(), "python": platform.python_version(),
            "settings": {"space": "smoke" if args.smoke else str(args.space), "steps": space.probe.steps,
                         "before_space": str(args.before_space) if args.before_space else None,
                         "n_trials": args.trials, "compare": args.compare,
                         "load_average_at_start": os.getloadavg()[0],
                         "probe": space.probe.model_dump(mode="json"), "backend": space.backend.value}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path, nargs="?", default=DEFAULT_SPACE)
    ap.add_argument("--steps", type=int, help="override probe.steps (default: the space's; smoke: 12)")
    ap.add_argument("--trials", type=int, default=2, help="trials of the timed study")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU space with the emulated backend")
    ap.add_argument("--workdir", type=Path, help="where the study's files go (default: a temp dir)")
    ap.add_argument("--compare", action="store_true",
                    help="run the study BEFORE (PRECSEARCH_SYNC_RECORD=1) and AFTER, side by side")
    ap.add_argument("--only", choices=VARIANTS, help="run one of --compare's two studies (for --merge)")
    ap.add_argument("--before-code", type=Path, metavar="DIR",
                    help="with --compare: BEFORE runs the precsearch of this checkout (e.g. a git worktree of the "
                         "commit before a change) with the defaults, instead of this code with inline records")
    ap.add_argument("--before-space", type=Path, metavar="FILE",
                    help="with --compare: BEFORE runs this space file (e.g. the shipped space as it was at the "
                         "BEFORE commit) and AFTER the positional one; --steps applies to both")
    ap.add_argument("--merge", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                    help="compare two --only JSON reports instead of running anything")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.merge:
        report = merge(args.merge)
        for variant in VARIANTS:
            print_breakdown(report["compare"][variant])
        print_compare(report["compare"])
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, default=str))
        return 0

    steps = args.steps or (12 if args.smoke else None)
    data = load_space_data(args.space, args.smoke, steps)
    space = parse_space(data, file="smoke" if args.smoke else str(args.space),
                        base_dir=None if args.smoke else args.space.resolve().parent)
    device = resolve_device(space.probe.device)
    report: dict[str, Any] = {"meta": meta(args, space, device)}
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="bench_probe_"))).resolve()
    before_code = args.before_code.resolve() if args.before_code else None
    if before_code is not None and not (before_code / "precsearch" / "__init__.py").is_file():
        raise SystemExit(f"--before-code {before_code}: no precsearch package there")
    if args.compare or args.only:
        before_space = load_space_data(args.before_space, False, steps) if args.before_space else None
        report["compare"] = compare(data, args.trials, work, device, (args.only,) if args.only else VARIANTS,
                                    before_code, before_space)
    else:
        report["trial_breakdown"] = trial_breakdown(data, args.trials, work, device)
    print(f"\n{report['meta']['device']}, torch {torch.__version__}, TE {report['meta']['transformer_engine']}")
    for b in list(report["compare"].values())[:2] if "compare" in report else [report["trial_breakdown"]]:
        print_breakdown(b)
    if args.compare and not args.only:
        print_compare(report["compare"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
