"""Benchmarks that prove the probe: its throughput against a hand-written TE loop, and where a trial's time goes.

1. Throughput: for FP8 current scaling on every Linear but ``lm_head`` (and for
   BF16), precsearch's probe (``run_probe``, the space's probe settings and
   backend) against a minimal hand-written Transformer Engine loop on the same
   Llama-3 shape, data and step count (one ``te.autocast`` around the forward,
   torch AdamW). Target: probe >= 0.97x the hand loop.
2. Trial wall time: a real 2-trial ``precsearch run`` in a subprocess, split
   with the trials' ``probe_result.json`` phases and MLflow run times into
   start-up, build, BF16 reference share, warm-up and measured steps, eval,
   logging + other and teardown. Target: fixed overhead <= 10% of a trial.

    python scripts/bench_probe.py search_spaces/llama3_8b_h100.yaml --steps 30 --json out.json
    python scripts/bench_probe.py --smoke --json /tmp/bench_probe.json   # CPU, tiny space, < 3 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from precsearch.backends import get_backend, resolve_device
from precsearch.config.loader import parse_space
from precsearch.config.space import Space
from precsearch.policy import Policy
from precsearch.policy.rules import Rule
from precsearch.precision import Fp8Format, LayerRecipe, Precision
from precsearch.probe.data import TokenBatches
from precsearch.probe.model import Llama3, build_model, linear_layer_names
from precsearch.probe.runner import PARAM_DTYPES, run_probe
from precsearch.probe.data import load_batches

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
DEFAULT_SPACE = Path("search_spaces/llama3_8b_h100.yaml")
#: Hand-loop steps left out of the timing (allocations, first FP8 casts, autotuning).
SKIP_STEPS = 3


# ---------------------------------------------------------------- environment

def te_module() -> Any | None:
    """``transformer_engine.pytorch`` if it imports, else None."""
    try:
        import transformer_engine.pytorch as te
    except Exception:  # noqa: BLE001 - any import failure means "no TE here"
        return None
    return te


def te_version() -> str | None:
    """Transformer Engine's version, or None without it."""
    try:
        import transformer_engine
    except Exception:  # noqa: BLE001
        return None
    return getattr(transformer_engine, "__version__", "unknown")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    """Release what the previous run left behind."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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


# ---------------------------------------------------------------- part 1: throughput

def fp8_everywhere_but_head(clip: float | None, fmt: Fp8Format) -> Policy:
    """FP8 current scaling on every Linear except ``lm_head``, torch AdamW, no FP8 warm-up."""
    head = Rule(name="lm_head", modules=("lm_head",), precision=Precision.BF16)
    return Policy(rules=(head,), default=Precision.FP8_CURRENT, recipe=LayerRecipe(fp8_format=fmt),
                  clip_grad=clip)


def probe_tokens_per_s(space: Space, policy: Policy, data: TokenBatches, device: torch.device) -> float:
    """Tokens/s that precsearch's probe reports for ``policy`` (median step of its final regime)."""
    backend = get_backend(space.backend.value, device)
    result = run_probe(space.model.probe(), space.probe, policy, data, backend, device)
    return result.tokens_per_s


def swap_linears(model: Llama3, make: Callable[[nn.Linear], nn.Module], skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every projection but ``skip`` by ``make(old)`` (plain setattr); return how many."""
    count = 0
    for name in linear_layer_names(model.cfg):
        if name in skip:
            continue
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, make(getattr(owner, child)))
        count += 1
    return count


def te_linear_from(te: Any, old: nn.Linear) -> nn.Module:
    """A ``te.Linear`` with ``old``'s shape, dtype, device and weight values."""
    new = te.Linear(old.in_features, old.out_features, bias=False, params_dtype=old.weight.dtype,
                    device=old.weight.device)
    with torch.no_grad():
        new.weight.copy_(old.weight)
    return new


def te_recipe(fmt: Fp8Format) -> Any:
    """TE's ``Float8CurrentScaling`` recipe in ``fmt``."""
    from transformer_engine.common.recipe import Float8CurrentScaling, Format

    return Float8CurrentScaling(fp8_format=Format.HYBRID if fmt is Fp8Format.HYBRID else Format.E4M3)


def hand_model(space: Space, device: torch.device, fp8: bool) -> Llama3:
    """The probe's Llama 3 built by hand: seeded, cast to the probe's dtype, te.Linear swapped in for FP8."""
    cfg, probe = space.model.probe(), space.probe
    model = build_model(cfg, probe.seed, device)
    model.to(dtype=PARAM_DTYPES[probe.param_dtype])
    model.model.rotary_emb.reset_inv_freq()  # as the probe: RoPE frequencies stay fp32
    if fp8:
        te = te_module()
        swap_linears(model, lambda old: te_linear_from(te, old))
    return model


def hand_loop_tokens_per_s(space: Space, fp8: bool, fmt: Fp8Format, clip: float | None,
                           data: TokenBatches, device: torch.device) -> float:
    """Tokens/s of a minimal training loop: one te.autocast (FP8) inside torch.autocast(bf16), AdamW."""
    probe = space.probe
    model = hand_model(space, device, fp8)
    opt = torch.optim.AdamW(model.parameters(), lr=probe.lr, betas=probe.betas, weight_decay=probe.weight_decay)
    recipe = te_recipe(fmt) if fp8 else None
    max_norm = clip if clip is not None else float("inf")
    times = []
    for step in range(probe.steps):
        sync(device)
        t0 = time.perf_counter()
        inputs, targets = (t.to(device) for t in data.train_batch(step))
        with torch.autocast(device.type, dtype=torch.bfloat16), fp8_context(recipe):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    timed = times[min(SKIP_STEPS, len(times) - 1):]
    return probe.seq_len * probe.micro_batch / statistics.median(timed)


@contextlib.contextmanager
def fp8_context(recipe: Any | None) -> Iterator[None]:
    """``te.autocast(enabled=True, recipe=recipe)``, or nothing when ``recipe`` is None."""
    if recipe is None:
        yield
        return
    with te_module().autocast(enabled=True, recipe=recipe):
        yield


def throughput_table(space: Space, device: torch.device) -> list[dict]:
    """Probe vs hand loop, BF16 and FP8 current scaling (the latter only with TE on a GPU)."""
    data = load_batches(space)
    clip = space.search.clip_grad.options()[0]
    fmt = Fp8Format(space.search.recipe.fp8_format.options()[0])
    fp8_ok = device.type == "cuda" and te_module() is not None and space.backend.value == "te"
    rows = []
    for name, fp8 in (("fp8_current (all but lm_head)", True), ("bf16", False)):
        if fp8 and not fp8_ok:
            rows.append({"policy": name, "skipped": "needs TE on a CUDA GPU and backend te"})
            continue
        policy = fp8_everywhere_but_head(clip, fmt) if fp8 else Policy.bf16(clip)
        hand = hand_loop_tokens_per_s(space, fp8, fmt, clip, data, device)
        free_memory(device)
        probe = probe_tokens_per_s(space, policy, data, device)
        free_memory(device)
        rows.append({"policy": name, "probe_tok_s": probe, "hand_tok_s": hand, "ratio": probe / hand})
        print(f"done: {name}: probe {probe:.0f} tok/s, hand loop {hand:.0f} tok/s", file=sys.stderr, flush=True)
    return rows


def print_throughput(rows: list[dict], space: Space, device: torch.device) -> None:
    """The throughput table."""
    cfg, p = space.model.probe(), space.probe
    print(f"\n[1] throughput: probe {cfg.n_layers} layers, dim {cfg.dim}, seq {p.seq_len}, micro-batch "
          f"{p.micro_batch}, {p.steps} steps, params {p.param_dtype}, backend {space.backend.value} on {device}")
    print(f"{'policy':32s} {'probe tok/s':>12} {'hand tok/s':>12} {'ratio':>7}  target >= 0.97x")
    for r in rows:
        if "skipped" in r:
            print(f"{r['policy']:32s} skipped: {r['skipped']}")
        else:
            verdict = "ok" if r["ratio"] >= 0.97 else "BELOW"
            print(f"{r['policy']:32s} {r['probe_tok_s']:12.0f} {r['hand_tok_s']:12.0f} {r['ratio']:6.3f}x  {verdict}")


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


def run_study_process(space_path: Path, n_trials: int, out_dir: Path) -> tuple[float, float]:
    """``precsearch run`` in a subprocess; its start and end (epoch seconds). Raises with its log on failure."""
    cmd = [sys.executable, "-m", "precsearch", "run", str(space_path), "--n-trials", str(n_trials),
           "--output-dir", str(out_dir), "--no-progress"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
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
    phases = {"build": 0.0, "warmup_steps": 0.0, "measured_steps": 0.0, "eval": 0.0}
    for r in runs:
        ph = (r["probe_result"] or {}).get("phase_s", {}) if r["duplicate_of"] == "-" else {}
        phases["build"] += ph.get("build", 0.0)
        phases["warmup_steps"] += ph.get("warmup_steps", 0.0)
        phases["measured_steps"] += ph.get("fp8_steps", 0.0) + ph.get("bf16_steps", 0.0)
        phases["eval"] += ph.get("eval", 0.0)
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
        "logging + other": trials_span - ref_s - sum(phases.values()),
        "teardown": t1 - last,
    }


#: Components paid once per ``precsearch run`` (or per reference key), not once per trial.
PER_PROCESS = ("startup: process + imports + CUDA init", "startup: study setup (storage, data, MLflow)",
               "BF16 reference", "teardown")


def overhead_at(totals: dict[str, float], n_run: int, n_target: int) -> float:
    """Fixed-overhead share of a trial if the same study ran ``n_target`` trials instead of ``n_run``."""
    per_trial = {k: v / (n_target if k in PER_PROCESS else n_run) for k, v in totals.items()}
    return 1 - (per_trial["warm-up steps"] + per_trial["measured steps"]) / sum(per_trial.values())


def trial_breakdown(space_data: dict, n_trials: int, work: Path, device: torch.device) -> dict[str, Any]:
    """Run the study, time a start-up-only process, and split the mean trial's wall time."""
    work.mkdir(parents=True, exist_ok=True)
    space_path = work / "space.yaml"
    space_path.write_text(yaml.safe_dump(space_data, sort_keys=False))
    out_dir = work / "study"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    startup = time_startup(device.type == "cuda")
    print(f"done: start-up process {startup['process_s']:.1f}s", file=sys.stderr, flush=True)
    t0, t1 = run_study_process(space_path, n_trials, out_dir)
    print(f"done: {n_trials}-trial study {t1 - t0:.1f}s", file=sys.stderr, flush=True)
    runs = trial_runs(out_dir)
    totals = breakdown(t0, t1, runs, reference_walls(out_dir), startup)
    per_trial = {k: v / len(runs) for k, v in totals.items()}
    steps = per_trial["warm-up steps"] + per_trial["measured steps"]
    trial_s = (t1 - t0) / len(runs)
    return {"process_wall_s": t1 - t0, "n_trials": len(runs), "trial_s": trial_s, "per_trial_s": per_trial,
            "fixed_overhead_share": 1 - steps / trial_s, "startup_process": startup,
            "study_n_trials": space_data.get("study", {}).get("n_trials", n_trials),
            "fixed_overhead_share_at_study_n_trials": overhead_at(
                totals, len(runs), space_data.get("study", {}).get("n_trials", n_trials)),
            "trials": [{k: v for k, v in r.items() if k != "probe_result"} | {"phase_s": (r["probe_result"] or {})
                        .get("phase_s")} for r in runs], "output_dir": str(out_dir)}


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
    share = b["fixed_overhead_share"]
    print(f"fixed overhead (all but warm-up + measured steps): {100 * share:.1f}% of a trial  "
          f"target <= 10%  {'ok' if share <= 0.10 else 'ABOVE'}")
    print(f"  same costs spread over the space's study.n_trials = {b['study_n_trials']}: "
          f"{100 * b['fixed_overhead_share_at_study_n_trials']:.1f}%")


# ---------------------------------------------------------------- main

def meta(args: argparse.Namespace, space: Space, device: torch.device) -> dict[str, Any]:
    """Date, hardware, versions and settings for the JSON report."""
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {platform.machine()}",
            "torch": torch.__version__, "transformer_engine": te_version(), "python": platform.python_version(),
            "settings": {"space": "smoke" if args.smoke else str(args.space), "steps": space.probe.steps,
                         "n_trials": args.trials, "hand_loop_skip_steps": SKIP_STEPS,
                         "probe": space.probe.model_dump(mode="json"), "backend": space.backend.value}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path, nargs="?", default=DEFAULT_SPACE)
    ap.add_argument("--steps", type=int, help="override probe.steps (default: 30; smoke: 12)")
    ap.add_argument("--trials", type=int, default=2, help="trials of the timed study")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU space with the emulated backend")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-study", action="store_true")
    ap.add_argument("--workdir", type=Path, help="where the study's files go (default: a temp dir)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    steps = args.steps or (12 if args.smoke else 30)
    data = load_space_data(args.space, args.smoke, steps)
    space = parse_space(data, file="smoke" if args.smoke else str(args.space),
                        base_dir=None if args.smoke else args.space.resolve().parent)
    device = resolve_device(space.probe.device)
    report: dict[str, Any] = {"meta": meta(args, space, device)}
    if not args.skip_throughput:
        report["throughput"] = throughput_table(space, device)
    if not args.skip_study:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_probe_"))
        report["trial_breakdown"] = trial_breakdown(data, args.trials, work, device)
    print(f"\n{report['meta']['device']}, torch {torch.__version__}, TE {report['meta']['transformer_engine']}")
    if "throughput" in report:
        print_throughput(report["throughput"], space, device)
    if "trial_breakdown" in report:
        print_breakdown(report["trial_breakdown"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
