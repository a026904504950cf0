"""The exported policy where users train it: Megatron-Core, torchtitan (torchao) and Accelerate, on one GPU.

For each policy of :data:`frameworks_plan.POLICIES` (BF16, uniform FP8 current, attention current + MLP
delayed, BF16 first/last blocks, BF16 moments with the precision-aware optimizer, MXFP8) and each framework,
precsearch's own export code writes the files, then a fresh process (``benchmarks/frameworks_runs.py``, one per
run, ``--run-timeout`` each) trains with them:

* Megatron-Core: ``GPTModel`` with ``get_gpt_layer_with_transformer_engine_spec()``, the exported flags as
  ``TransformerConfig`` fields, the YAML as ``quant_recipe`` (``RecipeConfig.from_yaml_file``), Megatron's
  DDP and ``get_megatron_optimizer`` with the optimizer flags as ``OptimizerConfig`` fields;
* torchtitan: torchtitan when it imports, else torchao's ``convert_to_float8_training`` with the exported
  ``filter_fqns`` under torchtitan's substring rule, on a Hugging Face ``LlamaForCausalLM``;
* Accelerate: the exported ``accelerate_fp8.py`` executed as written, with our model, optimizer, dataloader.

Each row beside the framework's own BF16 row (tokens/s, peak GiB, loss after the last step) and beside
precsearch's memory model for the same shape, with the per-module check: every module's precision in its
latest forward against the policy's. ``--memory-breakdown`` adds the probe and Megatron at each policy of
``--breakdown-policies``, with the peak inside each phase of the steady steps. ``--smoke`` (no GPU needed)
does everything but the training: exports, config fields, filters, matchers, predictions.

``--from-study DIR [DIR ...]`` (issue 52 item 4) runs a finished study's front trials instead (``--trials N ...``:
those), each as policy ``trial N``, in the study's target, or in every framework that runs the trial as it is
(the others skipped, saying why), at the study model's width and ``--layers`` blocks, beside each framework's
BF16 run; the report sets the front's memory saved and speed-up against the framework's, with the
differences and pass/fail against +-2 points / +-5%.

    python benchmarks/bench_frameworks.py --json $OUT/bench_frameworks.json
    python benchmarks/bench_frameworks.py --smoke --json /tmp/frameworks_smoke.json
    python benchmarks/bench_frameworks.py --layers 32 --frameworks megatron --policies bf16 fp8_current \\
        --memory-breakdown --optimizer adamw      # the full 8B depth: torch AdamW on BF16 params fits one H200
    python benchmarks/bench_frameworks.py --from-study precsearch-runs/NAME --layers 4   # a study's front picks
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import frameworks_plan as plan  # noqa: E402

BASELINE = "bf16"
WORKER = Path(__file__).resolve().parent / "frameworks_runs.py"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Shape, what to run, limits and output of one bench call."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = plan.Shape()
    for field, default in plan.shape_dict(defaults).items():
        ap.add_argument(f"--{field.replace('_', '-')}", type=int, default=default)
    ap.add_argument("--frameworks", nargs="+", choices=[*plan.FRAMEWORKS, "probe"], default=list(plan.FRAMEWORKS),
                    help="default: the three frameworks; probe: precsearch's own step (as --memory-breakdown runs it)")
    ap.add_argument("--policies", nargs="+", choices=list(plan.POLICIES), default=list(plan.POLICIES))
    ap.add_argument("--memory-breakdown", action="store_true", help="also the probe and Megatron, phase by phase")
    ap.add_argument("--breakdown-policies", nargs="+", choices=list(plan.POLICIES), default=["bf16", "fp8_current"])
    ap.add_argument("--optimizer", choices=plan.OPTIMIZERS, default="framework",
                    help="framework: Megatron-Core's own DDP + optimizer; adamw: torch's fused AdamW on the BF16 "
                         "parameters for Megatron and the probe (what fits the full 8B depth on one H200)")
    ap.add_argument("--smoke", action="store_true", help="no training: exports, configs, filters, matchers")
    ap.add_argument("--run-timeout", type=float, default=120.0, help="seconds per framework run")
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds for the whole bench; later runs skipped")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                    help="no runs: join the rows of earlier bench JSONs (one device call each) into one table")
    ap.add_argument("--calibrate", nargs="+", type=Path, metavar="JSON",
                    help="with --merge: calibrate the probe's memory model on the probe rows of these bench "
                         "JSONs (smaller depths, same optimizer) and add each row's calibrated prediction")
    ap.add_argument("--from-study", nargs="+", type=Path, metavar="DIR",
                    help="run the Pareto front's trials of each finished study (its --output-dir) in the study's "
                         "target, or in every framework that runs the trial as it is, at the study model's width "
                         "(--layers blocks), beside each framework's BF16 run; report memory saved and speed-up "
                         "against the front's")
    ap.add_argument("--trials", nargs="+", type=int, metavar="N",
                    help="with --from-study: these trials (front or not) instead of the front's")
    ap.add_argument("--max-picks", type=int, metavar="K",
                    help="with --from-study: the K front trials that save the most memory (default: all of them)")
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/<date>_<gpu|cpu>_bench_frameworks.json "
                                              "(--from-study: ..._bench_frameworks_from_study.json)")
    args = ap.parse_args(argv)
    flags = sys.argv[1:] if argv is None else argv
    args.given = {f for f in plan.shape_dict(defaults)  # shape fields set on the command line (--from-study)
                  if any(a == f"--{f.replace('_', '-')}" or a.startswith(f"--{f.replace('_', '-')}=") for a in flags)}
    if args.calibrate and not args.merge:
        ap.error("--calibrate needs --merge (it calibrates merged rows of earlier runs)")
    if args.max_picks is not None and (not args.from_study or args.trials or args.max_picks < 1):
        ap.error(f"--max-picks {args.max_picks}: needs --from-study without --trials, and K >= 1")
    if args.trials and not args.from_study:
        ap.error("--trials needs --from-study (it picks a study's trials)")
    if args.from_study and args.merge:
        ap.error("--from-study runs; --merge joins earlier runs: give one")
    try:
        args.shape = plan.Shape(**{f: getattr(args, f) for f in plan.shape_dict(defaults)})
    except ValueError as exc:
        ap.error(str(exc))
    return args


def runs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(framework, policy) in run order: each framework's BF16 rows first (``bf16``, and Accelerate's
    :data:`frameworks_plan.BF16_MASTER` where a knob row needs it); the breakdown's probe and Megatron last.
    With torchtitan and the probe, the probe also runs each policy torchtitan runs differently, as it runs it
    (:func:`frameworks_plan.as_torchtitan_runs`): what that torchtitan row's speed-up is compared with."""
    out = []
    for fw in args.frameworks:
        baselines = [plan.baseline_of(fw, name) for name in args.policies]
        out += [(fw, name) for name in dict.fromkeys([BASELINE, *baselines, *args.policies])
                if plan.runs_policy(fw, name)]
    if "torchtitan" in args.frameworks and "probe" in args.frameworks:
        out += [("probe", p + plan.AS_TORCHTITAN) for p in args.policies
                if plan.runs_differently_in_torchtitan(p, args.shape.layers)]
    if args.memory_breakdown:
        out += [(fw, p) for p in args.breakdown_policies for fw in ("probe", "megatron")
                if (fw, p) not in out]
    return out


def prepare(framework: str, policy_name: str, shape: plan.Shape, workdir: Path,
            optimizer: str = "framework") -> dict[str, Any]:
    """Export the policy for the framework and check the files on the CPU: the row's static part."""
    policy = plan.policy_named(policy_name, shape.layers)
    if optimizer != "framework" and framework not in ("megatron", "probe"):
        raise ValueError(f"--optimizer {optimizer} is for Megatron-Core and the probe, not {framework}")
    row: dict[str, Any] = {"framework": framework, "policy": policy_name, "optimizer": optimizer,
                           "predicted_gib": plan.predicted_peak_gib(policy, shape, framework, optimizer)}
    export_dir = workdir / f"{framework}__{policy_name}".replace("+", "_").replace(" ", "_")
    row["export_dir"] = str(export_dir)
    fmt = "megatron" if framework == "probe" else framework
    files, row["export_warnings"] = plan.export_files(fmt, policy, shape.layers, export_dir)
    row["files"] = sorted(files)
    if fmt == "megatron":
        mplan = plan.megatron_plan(policy, shape.layers)
        row["config"] = {k: mplan[k] for k in ("transformer", "optimizer", "ddp", "quant_recipe")}
        row["files_check"] = plan.check_modules(plan.megatron_decided(files, shape.layers),
                                                plan.megatron_expected(policy, shape.layers))
        if framework == "megatron" and optimizer == "framework":
            row |= optimizer_state(policy, shape)
    elif fmt == "torchtitan":
        tplan = plan.titan_plan(files)
        row["config"] = tplan
        decided = {n: plan.P.FP8_CURRENT.value if tplan["converters"] == [plan.CONVERTER]
                   and plan.titan_converts(n, tplan["filter_fqns"]) else
                   plan.P.MXFP8.value if tplan["converters"] and plan.titan_converts(n, tplan["filter_fqns"])
                   else plan.P.BF16.value for n in plan.hf_expected(policy, shape.layers)}
        row["files_check"] = plan.check_modules(decided, plan.hf_expected(policy, shape.layers))
    else:
        row["config"] = plan.accelerate_plan(files)
    return row


def optimizer_state(policy, shape: plan.Shape) -> dict[str, Any]:
    """What a Megatron row's optimizer step is for (:mod:`precsearch.probe.framework_step`): the state Megatron's
    export keeps (``optimizer_state``), whether it clips (``clipped``), the model's parameters (``n_params``)."""
    from precsearch.export.registry import TARGETS, as_run
    from precsearch.probe.framework_step import state_key

    return {"optimizer_state": state_key(as_run(TARGETS["megatron"], policy, shape.layers).memory),
            "clipped": policy.clip_grad is not None, "n_params": shape.model_config().num_params()}


def optimizer_rate_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each timed Megatron row's optimizer step per parameter beside the rate precsearch predicts with
    (:func:`~precsearch.probe.framework_step.rate_for`; ``-`` where it has none for that state, clipping
    and card): a run that did not make a rate checks it."""
    from precsearch.probe.framework_step import rate_for

    timed = [r for r in rows if r.get("optimizer_state") and r.get("phase_ms", {}).get("step")]
    if not timed:
        return []
    lines = ["", "optimizer step per parameter (the rate precsearch predicts Megatron's speed-up with)",
             f"{'policy':36s} {'state':38s} {'clip':>4} {'card':24s} {'step ms':>7} {'ps/param':>8} {'rate':>6} "
             f"{'diff':>6}"]
    for r in timed:
        measured = r["phase_ms"]["step"] * 1e-3 / r["n_params"]
        found = rate_for("megatron", r["optimizer_state"], r["clipped"], r.get("card", ""))
        rate = found.s_per_param if found else None
        lines.append(f"{r['policy']:36s} {r['optimizer_state']:38s} {'yes' if r['clipped'] else 'no':>4} "
                     f"{r.get('card', '?')[:24]:24s} {r['phase_ms']['step']:7.1f} {1e12 * measured:8.2f} "
                     f"{_fmt(rate and 1e12 * rate, '6.2f'):>6} "
                     f"{_fmt(rate and 100 * (measured / rate - 1), '+5.1f%'):>6}")
    return lines


def run_one(row: dict[str, Any], shape: plan.Shape, timeout: float) -> dict[str, Any]:
    """Train in a fresh process; its result, or the row's ``error`` (timeout, crash, exception)."""
    spec = {"framework": row["framework"], "policy": row["policy"], "shape": plan.shape_dict(shape),
            "export_dir": row["export_dir"], "optimizer": row.get("optimizer", "framework")}
    extra = row["policy"].partition(plan.AS_TORCHTITAN)[0]
    if extra not in plan.POLICIES and extra in plan.EXTRA_POLICIES:  # a study's trial: the worker gets it whole
        spec |= {"policy": extra, "policy_dict": plan.EXTRA_POLICIES[extra].to_dict()}
    spec_path = Path(row["export_dir"]) / "_spec.json"
    out_path = Path(row["export_dir"]) / "_result.json"
    spec_path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(WORKER), str(spec_path), str(out_path)], timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    result = json.loads(out_path.read_text()) if out_path.exists() else {
        "error": f"worker exited {proc.returncode} without a result: {proc.stderr.strip()[-400:]}"}
    result["wall_s"] = time.perf_counter() - t0
    return result


def relative(rows: list[dict[str, Any]]) -> None:
    """Each row's speed and peak against its BF16 row (``baseline``: :func:`frameworks_plan.baseline_of`, or
    the framework's ``bf16`` row where that did not run), and its peak against the prediction."""
    ran = {(r["framework"], r["policy"]): r for r in rows if "peak_gib" in r}
    for r in rows:
        if "peak_gib" not in r:
            continue
        r["peak_vs_predicted"] = r["peak_gib"] / r["predicted_gib"] - 1
        b = ran.get((r["framework"], plan.baseline_of(r["framework"], r["policy"]))) or ran.get(
            (r["framework"], BASELINE))
        r.pop("baseline", None)
        if b is not None and b is not r:
            r["baseline"] = b["policy"]
            r["speedup_vs_bf16"] = r["tokens_per_s"] / b["tokens_per_s"]
            r["peak_vs_bf16"] = r["peak_gib"] / b["peak_gib"] - 1


def agreement(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 30's targets per framework run against its own BF16 run: memory saved as measured, as the memory
    model predicts it (the row's prediction over the BF16 row's) and as the probe measured it at the same policy
    (its ``--memory-breakdown`` rows), in points of the BF16 peak; the FP8 speed-up measured and the probe's.
    Reads the columns :func:`relative` adds."""
    ok = {(r["framework"], r["policy"]): r for r in rows if "peak_gib" in r}
    out = []
    for (framework, policy), r in ok.items():
        base = ok.get((framework, r.get("baseline", "")))
        if framework == "probe" or policy in (BASELINE, plan.BF16_MASTER) or base is None:
            continue
        entry = {"framework": framework, "policy": policy, "baseline": base["policy"],
                 "saved_pts": -100 * r["peak_vs_bf16"],
                 "model_saved_pts": 100 * (1 - r["predicted_gib"] / base["predicted_gib"]),
                 "speedup": r["speedup_vs_bf16"]}
        # torchtitan runs some policies with fewer FP8 layers: compared with the probe of what it runs, if that ran
        as_run = ok.get(("probe", policy + plan.AS_TORCHTITAN)) if framework == "torchtitan" else None
        probe = as_run or ok.get(("probe", policy))
        if probe and ("probe", BASELINE) in ok:
            entry["probe_policy"] = probe["policy"]
            entry["probe_saved_pts"] = -100 * probe["peak_vs_bf16"]
            entry["probe_speedup"] = probe["speedup_vs_bf16"]
            entry["speedup_vs_probe"] = entry["speedup"] / entry["probe_speedup"] - 1
        entry["model_minus_measured_pts"] = entry["model_saved_pts"] - entry["saved_pts"]
        out.append(entry)
    return out


def agreement_table(entries: list[dict[str, Any]]) -> str:
    """The :func:`agreement` entries as text: saved points (measured, model, probe), speed-ups."""
    lines = [f"{'framework':11s} {'policy':36s} {'saved':>6} {'model':>6} {'m-meas':>6} {'probe':>6} "
             f"{'x bf16':>6} {'probe x':>7} {'vs probe':>8}  against"]
    for e in entries:
        lines.append(f"{e['framework']:11s} {e['policy']:36s} {e['saved_pts']:+6.1f} "
                     f"{_fmt(e['model_saved_pts'], '+6.1f'):>6} {_fmt(e['model_minus_measured_pts'], '+6.1f'):>6} "
                     f"{_fmt(e.get('probe_saved_pts'), '+6.1f'):>6} "
                     f"{e['speedup']:6.2f} {_fmt(e.get('probe_speedup'), '7.2f'):>7} "
                     f"{_fmt(100 * e.get('speedup_vs_probe', math.nan), '+7.1f%'):>8}  {e['baseline']}")
    return "\n".join(lines)


def _fmt(value: Any, spec: str) -> str:
    """``value`` in ``spec`` (a trailing ``%`` is printed after it), or ``-`` for none or NaN."""
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "-"
    return format(value, spec.removesuffix("%")) + ("%" if spec.endswith("%") else "")


def _trained(check: dict[str, Any] | None) -> str:
    """The run's training check (``frameworks_plan.check_training``): weights that moved of all, or what not."""
    if not check:
        return "-"  # a row from before the check
    if check["n_not_in_optimizer"]:
        return f"{check['n_not_in_optimizer']} lost"  # parameters the optimizer does not hold
    return f"{check['moved']}/{check['matrices']}"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table (an error row shows its error)."""
    lines = [f"{'framework':11s} {'policy':36s} {'tok/s':>7} {'x bf16':>6} {'peak':>6} {'pred':>6} {'vs pred':>7} "
             f"{'loss':>7} {'modules':>8} {'files':>6} {'trained':>7}"]
    for r in rows:
        files = r.get("files_check")
        files_s = f"{files['ok']}/{files['modules']}" if files else "-"
        head = f"{r['framework']:11s} {r['policy']:36s}"
        if "error" in r:
            lines.append(f"{head} {'':>7} {'':>6} {'':>6} {_fmt(r['predicted_gib'], '6.2f')} {'':>7} {'':>7} "
                         f"{'':>8} {files_s:>6}  {r['error'][:110]}")
            continue
        mods = r.get("modules")
        vs = r.get("peak_vs_predicted")
        lines.append(f"{head} {_fmt(r['tokens_per_s'], '7.0f')} {_fmt(r.get('speedup_vs_bf16'), '6.2f')} "
                     f"{_fmt(r['peak_gib'], '6.2f'):>6} {_fmt(r['predicted_gib'], '6.2f'):>6} "
                     f"{_fmt(None if vs is None else 100 * vs, '+6.1f%'):>7} {_fmt(r['last_loss'], '7.3f')} "
                     f"{(str(mods['ok']) + '/' + str(mods['modules'])) if mods else '-':>8} {files_s:>6} "
                     f"{_trained(r.get('trained')):>7}")
    lines += [f"  x bf16 of {r['framework']} {r['policy']}: against its {r['baseline']} row" for r in rows
              if r.get("baseline", BASELINE) != BASELINE]
    phased = [r for r in rows if "phase_peak_gib" in r and r["framework"] in ("probe", "megatron")]
    if phased:
        lines += ["", "memory by phase (peak inside each phase of the steady steps, GiB)",
                  f"{'framework':11s} {'policy':36s} {'start':>6} {'fwd':>6} {'bwd':>6} {'step':>6} {'peak':>6}"]
        for r in phased:
            ph = r["phase_peak_gib"]
            lines.append(f"{r['framework']:11s} {r['policy']:36s} {r['start_gib']:6.2f} {ph['forward']:6.2f} "
                         f"{ph['backward']:6.2f} {ph['step']:6.2f} {r['peak_gib']:6.2f}")
    timed = [r for r in rows if r.get("phase_ms")]
    if timed:
        lines += ["", "time by phase (median ms of the timed steps, CUDA events)",
                  f"{'framework':11s} {'policy':36s} {'fwd':>7} {'bwd':>7} {'step':>7}"]
        lines += [f"{r['framework']:11s} {r['policy']:36s} " + " ".join(f"{r['phase_ms'].get(p, math.nan):7.1f}"
                                                                       for p in ("forward", "backward", "step"))
                  for r in timed]
    lines += optimizer_rate_lines(rows)
    return "\n".join(lines)


def bench(args: argparse.Namespace, workdir: Path, run_list: list[tuple[str, str]] | None = None,
          start: float | None = None) -> list[dict[str, Any]]:
    """Prepare every run (``run_list``, default :func:`runs`), then (not ``--smoke``) train each in its own
    process until the deadline (counted from ``start``, default now)."""
    start = time.perf_counter() if start is None else start
    rows = []
    for framework, policy_name in runs(args) if run_list is None else run_list:
        try:
            row = prepare(framework, policy_name, args.shape, workdir, args.optimizer)
        except Exception as exc:  # noqa: BLE001 - an export that fails is that row's result
            rows.append({"framework": framework, "policy": policy_name, "predicted_gib": math.nan,
                         "error": f"export: {type(exc).__name__}: {exc}"})
            continue
        left = args.deadline - (time.perf_counter() - start)
        if args.smoke:
            row["error"] = "skipped (--smoke): training needs a CUDA GPU"
        elif left < 10:
            row["error"] = f"skipped: --deadline {args.deadline:.0f} s reached"
        else:
            row |= run_one(row, args.shape, min(args.run_timeout, left))
        print(f"  {framework} {policy_name}: {row.get('error') or 'ok'} ({time.perf_counter() - start:.0f} s)",
              file=sys.stderr, flush=True)
        rows.append(row)
    relative(rows)
    return rows


def merged(paths: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of several bench JSONs (a later file's row replaces an earlier one of the same framework and
    policy, unless only the earlier one has a measurement), their predictions (today's memory model; the
    run's as ``predicted_gib_at_run``) and relative columns recomputed; the first file's meta with every
    file's listed. The shapes must agree: rows of different shapes are not comparable."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    metas = []
    for path in paths:
        data = json.loads(path.read_text())
        if metas and data["meta"]["shape"] != metas[0]["shape"]:
            raise SystemExit(f"--merge: {path} has shape {data['meta']['shape']}, {paths[0]} has "
                             f"{metas[0]['shape']}")
        metas.append(data["meta"])
        for r in data["rows"]:
            for key in ("peak_vs_predicted", "speedup_vs_bf16", "peak_vs_bf16"):
                r.pop(key, None)
            shape = plan.Shape(**data["meta"]["shape"])
            if (r["framework"] in plan.PARAM_DTYPE  # today's memory model
                    and r["policy"].partition(plan.AS_TORCHTITAN)[0] in plan.POLICIES
                    and not r.get("error", "").startswith("export:")):  # (an export that failed has none)
                r.setdefault("predicted_gib_at_run", r["predicted_gib"])
                policy = plan.policy_named(r["policy"], shape.layers)
                # a row that ran says in its note whether it compiled; one that did not, what its export asks
                compiled = plan.compiled_run(r["framework"], r.get("note"), policy, shape.layers)
                r["predicted_gib"] = plan.predicted_peak_gib(policy, shape, r["framework"],
                                                             r.get("optimizer", "framework"), compiled)
            key = (r["framework"], r["policy"])
            if "peak_gib" in r or "peak_gib" not in rows.get(key, {}):
                rows[key] = r
    out = list(rows.values())
    relative(out)
    return out, metas[0] | {"merged_from": [str(p) for p in paths], "merged_meta": metas}


def calibrate(rows: list[dict[str, Any]], shape: plan.Shape, optimizer: str, paths: list[Path]) -> None:
    """Add ``calibrated_gib`` (the probe's model calibrated on the probe's peaks in ``paths``) and
    ``peak_vs_calibrated`` to each Megatron and probe row whose policy the probe ran at those depths."""
    peaks: dict[str, dict[int, float]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        if data["meta"].get("optimizer", "framework") != optimizer:
            raise SystemExit(f"--calibrate: {path} ran --optimizer {data['meta'].get('optimizer', 'framework')}, "
                             f"the merged rows {optimizer}")
        for r in data["rows"]:
            if r["framework"] == "probe" and "peak_gib" in r:
                peaks.setdefault(r["policy"], {})[data["meta"]["shape"]["layers"]] = r["peak_gib"]
    for r in rows:
        if r["framework"] in ("megatron", "probe") and r["policy"] in peaks:
            r["calibrated_on"] = sorted(peaks[r["policy"]])
            r["calibrated_gib"] = plan.calibrated_peak_gib(plan.policy_named(r["policy"], shape.layers), shape,
                                                           peaks[r["policy"]], optimizer)
            if "peak_gib" in r:
                r["peak_vs_calibrated"] = r["peak_gib"] / r["calibrated_gib"] - 1


def main(argv: list[str] | None = None) -> int:
    """Run the bench (or ``--merge`` earlier ones), print the table, write the JSON."""
    args = parse_args(argv)
    if args.from_study:
        return main_from_study(args)
    if args.merge:
        rows, meta = merged(args.merge)
        args.shape = plan.Shape(**meta["shape"])
        if args.calibrate:
            calibrate(rows, args.shape, meta.get("optimizer", "framework"), args.calibrate)
            meta["calibrated_from"] = [str(p) for p in args.calibrate]
    else:
        with tempfile.TemporaryDirectory(prefix="bench_frameworks_") as tmp:
            rows = bench(args, Path(tmp))
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "shape": plan.shape_dict(args.shape),
                "smoke": args.smoke, "deadline_s": args.deadline, "run_timeout_s": args.run_timeout,
                "optimizer": args.optimizer}
    s = args.shape
    print(f"\n{s.layers} blocks, dim {s.dim}, ffn {s.ffn}, vocab {s.vocab}, seq {s.seq}, mb {s.mb}, {s.steps} steps; "
          "x bf16 and peak against each framework's own BF16 row; pred = precsearch's memory model")
    print(table(rows))
    cal = [r for r in rows if "calibrated_gib" in r]
    if cal:
        print(f"\nthe probe's memory model calibrated on the probe's own peaks at {cal[0]['calibrated_on']} blocks "
              "(as a trial calibrates)")
        print(f"{'framework':11s} {'policy':36s} {'peak':>6} {'calib':>6} {'vs calib':>8}")
        for r in cal:
            vs = _fmt(100 * r["peak_vs_calibrated"], "+7.1f") + "%" if "peak_vs_calibrated" in r else "-"
            print(f"{r['framework']:11s} {r['policy']:36s} {_fmt(r.get('peak_gib'), '6.2f'):>6} "
                  f"{r['calibrated_gib']:6.2f} {vs:>8}")
    entries = agreement(rows)
    if entries:
        print("\nagainst each framework's BF16 run: memory saved in points of its peak (measured, memory model, "
              "probe at the same policy; m-meas = model - measured), FP8 speed-up (measured, probe's, difference)")
        print(agreement_table(entries))
    kind = "cpu" if args.smoke else "gpu"
    path = args.json or Path("benchmarks/results") / f"{datetime.date.today().isoformat()}_{kind}_bench_frameworks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows, "agreement": entries}, indent=1, default=str))
    print(f"wrote {path}")
    return 0



# --- from a study: the front's picks in each framework (issue 52 item 4) -------------------------------------

#: The targets of issue 52 item 4: the front's memory saved within this many points of the framework's, its
#: FP8 speed-up within this fraction of the framework's (same trial, each against its own BF16 run).
SAVED_PTS_TOLERANCE, SPEEDUP_TOLERANCE = 2.0, 0.05


def trial_policy_name(number: int) -> str:
    """The bench's name of a study's trial: ``trial 12``."""
    return f"trial {number}"


def _speedup_basis(score: dict[str, Any]) -> str:
    """Where a stored score's speed-up comes from: its framework target's run, predicted, or the probe."""
    predicted = score.get("speedup_framework")
    if isinstance(predicted, float) and math.isfinite(predicted):
        return f"{score.get('memory_framework')}'s run, predicted from the probe's step"
    return "the probe's" + (f" ({score['speedup_note']})" if score.get("speedup_note") else "")


def read_study(study_dir: Path, trials: list[int] | None, max_picks: int | None = None) -> dict[str, Any]:
    """A finished study's picks: the front's trials (most memory saved first), or ``trials``; each with its policy
    (as data), the front's memory saved (``memory_saved``: the study's own figure, on its ``memory_basis``) and
    speed-up (``speedup``: its framework target's, predicted, where the study predicted one, else the trial's
    tokens/s over the BF16 reference's; None where the study did not measure throughput; ``speedup_basis`` says
    which); ``max_picks``: only the first that many front trials. Also the study's name,
    ``target`` (its space's ``target: name``, or None) and model
    (:class:`~precsearch.arch.config.ModelConfig` of the space's target model, None where unreadable)."""
    import optuna

    from precsearch.config.model_section import ModelSection
    from precsearch.runtime.stores import open_storage
    from precsearch.runtime.target_space import recorded_policy
    from precsearch.runtime.workspace import Workspace
    from precsearch.search.front import trial_rows

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ws = Workspace.load(Path(study_dir))
    study = optuna.load_study(study_name=ws.study_name, storage=open_storage(ws.storage_url))
    space = study.user_attrs.get("space", {})
    rows = {r["trial"]: r for r in trial_rows(study, study.user_attrs["objectives"])}
    if trials:
        missing = [n for n in trials if n not in rows]
        if missing:
            raise SystemExit(f"--trials: {study_dir} has no finished, scored trial {missing} "
                             f"(it has {sorted(rows)})")
        chosen = [rows[n] for n in trials]
    else:
        chosen = sorted((r for r in rows.values() if r["pareto"]), key=lambda r: -r["memory_saved"])[:max_picks]
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    picks = []
    for r in chosen:
        policy = recorded_policy(by_number, r["trial"])
        if policy is None:
            raise SystemExit(f"{study_dir}: trial {r['trial']} recorded no policy")
        score = by_number[r["trial"]].user_attrs.get("score", {})
        speedup = score.get("speedup")
        measured = bool(r.get("tokens_per_s")) and bool(speedup)  # 0.0: no reference throughput
        picks.append({"trial": r["trial"], "name": trial_policy_name(r["trial"]), "policy": policy,
                      "pareto": r["pareto"], "memory_saved": r["memory_saved"],
                      "memory_saved_probe": score.get("memory_saved_probe"),
                      "memory_saved_target": score.get("memory_saved_target"),
                      "tokens_per_s": r.get("tokens_per_s"), "speedup": speedup if measured else None,
                      "speedup_se": score.get("speedup_se") if measured else None,  # its steps' noise, both runs
                      "speedup_basis": _speedup_basis(score), "instability_band": r.get("instability_band")})
    try:
        section = ModelSection(**space.get("model", {}))
        model, probe_layers = section.target(), section.probe().n_layers
    except (ValueError, TypeError) as exc:  # a space this version cannot read
        model, probe_layers, why = None, None, f"{type(exc).__name__}: {exc}"
    else:
        why = None
    return {"dir": str(study_dir), "study": ws.study_name, "target": (space.get("target") or {}).get("name"),
            "objectives": study.user_attrs["objectives"], "param_dtype": space.get("probe", {}).get("param_dtype",
                                                                                                    "fp32"),
            "memory_basis": space.get("objectives", {}).get("memory_basis") or "target", "model": model,
            "probe_layers": probe_layers, "probe_seq": space.get("probe", {}).get("seq_len"),
            "probe_mb": space.get("probe", {}).get("micro_batch"), "model_unreadable": why, "picks": picks,
            "space": space}


def front_saved(study: dict[str, Any], pick: dict[str, Any], layers: int) -> tuple[float, str]:
    """The front's memory saved for a bench run at ``layers`` blocks, and which figure it is. A study whose
    ``target:`` is a framework scores what that framework's run saves, predicted
    (:func:`~precsearch.runtime.target_memory.target_saving`): that prediction at the bench's depth. Otherwise
    the study's saving on the probe (``memory_saved_probe``, measured) when the bench runs the probe's depth, on
    the target model (``memory_saved_target``, predicted) when it runs the target's full depth, else the front's
    own ``memory_saved`` (on the study's ``memory_basis``)."""
    from precsearch.policy import Policy
    from precsearch.runtime.target_memory import target_saving

    model, target = study["model"], study.get("target")
    if target not in (None, "precsearch") and model is not None:
        saving = target_saving(study["space"], target, Policy.from_dict(pick["policy"]), layers)
        return saving.saved, f"{target}'s run at {layers} blocks, predicted (what a study for {target} scores)"
    if layers == study["probe_layers"] and pick.get("memory_saved_probe") is not None:
        return pick["memory_saved_probe"], "probe"
    if model is not None and layers == model.n_layers and pick.get("memory_saved_target") is not None:
        return pick["memory_saved_target"], "target"
    return pick["memory_saved"], f"memory_saved ({study['memory_basis']})"


def study_shape(args: argparse.Namespace, model, probe_seq: int | None = None,
                probe_mb: int | None = None) -> tuple[Any, str]:
    """The bench's shape for a study: the study model's width (dim, FFN, heads, vocabulary) at ``--layers``
    blocks (at most the model's), the study probe's sequence and micro-batch unless ``--seq``/``--mb`` are
    given, the bench's steps; and a line saying which depth was used."""
    import dataclasses

    if model is None:
        return args.shape, "the study's model is unreadable: the bench's shape (--dim ... as given)"
    layers = min(args.shape.layers, model.n_layers)
    shape = dataclasses.replace(args.shape, layers=layers, dim=model.dim, ffn=model.ffn_dim, heads=model.n_heads,
                                kv_heads=model.n_kv_heads, vocab=model.vocab_size)
    probe = {"seq": probe_seq, "mb": probe_mb}
    shape = dataclasses.replace(shape, **{k: v for k, v in probe.items() if v and k not in args.given})
    depth = (f"the full depth ({layers} blocks)" if layers == model.n_layers else
             f"{layers} of its {model.n_layers} blocks (--layers; the full depth where it fits one card)")
    return shape, f"the study model's width at {depth}"


def frameworks_for(study: dict[str, Any], pick: dict[str, Any], layers: int,
                   allowed: list[str]) -> tuple[list[str], list[dict[str, Any]], dict[str, list[str]]]:
    """Where a study's trial runs: the study's target if it names a framework, else every framework whose
    export runs the trial's policy as it is at ``layers`` blocks
    (:func:`~precsearch.export.registry.cannot_express`). Returns (frameworks, skipped: framework and why,
    what the study's own target runs otherwise: framework -> changes, where it does)."""
    from precsearch.export.registry import TARGETS, cannot_express
    from precsearch.policy import Policy

    policy = Policy.from_dict(pick["policy"])
    fws = [f for f in plan.FRAMEWORKS if f != "probe"]
    target = study["target"]
    chosen, skipped, otherwise = [], [], {}
    for fw in fws:
        changes = cannot_express(TARGETS.get(fw, plan.FRAMEWORKS[fw]), policy, layers, study["param_dtype"])
        if target in plan.FRAMEWORKS and fw != target:
            skipped.append({"framework": fw, "why": f"the study's target is {target}"})
        elif target not in plan.FRAMEWORKS and changes:
            skipped.append({"framework": fw, "why": "does not run it as it is: " + "; ".join(changes)})
        elif fw not in allowed:
            skipped.append({"framework": fw, "why": "not in --frameworks"})
        else:
            chosen.append(fw)
            if changes:  # the study's target, running this trial's combination otherwise (the front names it)
                otherwise[fw] = changes
    return chosen, skipped, otherwise


def study_runs(study: dict[str, Any], layers: int, allowed: list[str]) -> list[tuple[str, str]]:
    """(framework, policy) in run order for a study: per framework its BF16 rows first (``bf16``, and the
    baseline each trial's row is set against), then its trials. Sets each pick's ``frameworks``, ``skipped``
    and ``runs_otherwise``, and registers the trials' policies (:data:`frameworks_plan.EXTRA_POLICIES`)."""
    from precsearch.policy import Policy

    plan.EXTRA_POLICIES.clear()
    per_fw: dict[str, list[str]] = {}
    for pick in study["picks"]:
        plan.EXTRA_POLICIES[pick["name"]] = Policy.from_dict(pick["policy"])
        pick["frameworks"], pick["skipped"], pick["runs_otherwise"] = frameworks_for(study, pick, layers, allowed)
        for fw in pick["frameworks"]:
            per_fw.setdefault(fw, []).append(pick["name"])
    out = []
    for fw in plan.FRAMEWORKS:
        names = per_fw.get(fw, [])
        if names:
            out += [(fw, n) for n in dict.fromkeys([BASELINE, *(plan.baseline_of(fw, n) for n in names), *names])]
    return out


def study_report(study: dict[str, Any], rows: list[dict[str, Any]], layers: int) -> list[dict[str, Any]]:
    """Per (trial, framework): the front's memory saved (points) and speed-up against the framework's measured
    ones (each against its own BF16 row: :func:`relative`; the front's figure for the bench's depth,
    :func:`front_saved`, with the front's ``memory_saved`` kept as ``front_memory_saved_pts``), the differences
    (front minus framework; speed-up as front over framework, less 1) and pass/fail against
    :data:`SAVED_PTS_TOLERANCE` and :data:`SPEEDUP_TOLERANCE` (None where either side has no figure).
    ``model_saved_pts``: precsearch's memory model for the framework's run against its BF16 run's, at the
    bench's shape (there also under ``--smoke``)."""
    by = {(r["framework"], r["policy"]): r for r in rows}
    out = []
    for pick in study["picks"]:
        for fw in pick["frameworks"]:
            r = by.get((fw, pick["name"]), {})
            base = by.get((fw, plan.baseline_of(fw, pick["name"])), {})
            saved, basis = front_saved(study, pick, layers)
            e: dict[str, Any] = {"study": study["study"], "trial": pick["trial"], "framework": fw,
                                 "baseline": base.get("policy", plan.baseline_of(fw, pick["name"])),
                                 "front_saved_pts": 100 * saved, "front_saved_basis": basis,
                                 "front_memory_saved_pts": 100 * pick["memory_saved"],
                                 "front_speedup": pick["speedup"], "front_speedup_se": pick.get("speedup_se"),
                                 "front_speedup_basis": pick.get("speedup_basis", "the probe's"),
                                 "framework_saved_pts": -100 * r["peak_vs_bf16"] if "peak_vs_bf16" in r else None,
                                 "framework_speedup": r.get("speedup_vs_bf16"),
                                 "model_saved_pts": None, "runs_otherwise": pick["runs_otherwise"].get(fw, [])}
            if isinstance(r.get("predicted_gib"), float) and isinstance(base.get("predicted_gib"), float) \
                    and not math.isnan(r["predicted_gib"]) and not math.isnan(base["predicted_gib"]):
                e["model_saved_pts"] = 100 * (1 - r["predicted_gib"] / base["predicted_gib"])
            e["saved_diff_pts"] = (None if e["framework_saved_pts"] is None
                                   else e["front_saved_pts"] - e["framework_saved_pts"])
            e["speedup_diff"] = (None if e["front_speedup"] is None or e["framework_speedup"] is None
                                 else e["front_speedup"] / e["framework_speedup"] - 1)
            e["saved_pass"] = None if e["saved_diff_pts"] is None else abs(e["saved_diff_pts"]) <= SAVED_PTS_TOLERANCE
            e["speedup_pass"] = None if e["speedup_diff"] is None else abs(e["speedup_diff"]) <= SPEEDUP_TOLERANCE
            e["status"] = r.get("error") or base.get("error") or "measured"
            if e["front_speedup"] is None:
                e["speedup_note"] = "not measured by the study"
            out.append(e)
    return out


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else "pass" if ok else "FAIL"


def study_table(entries: list[dict[str, Any]]) -> str:
    """The :func:`study_report` entries as text: front vs framework, saved points and speed-up."""
    lines = [f"{'trial':>5} {'framework':11s} {'front saved':>11} {'fw saved':>8} {'diff':>6} {'model':>6} {'':4} "
             f"{'front x':>7} {'fw x':>6} {'diff':>7} {'':4}  status"]
    for e in entries:
        fx = "n/m" if e["front_speedup"] is None else f"{e['front_speedup']:7.2f}"
        lines.append(
            f"{e['trial']:5d} {e['framework']:11s} {e['front_saved_pts']:+11.1f} "
            f"{_fmt(e['framework_saved_pts'], '+8.1f'):>8} {_fmt(e['saved_diff_pts'], '+6.1f'):>6} "
            f"{_fmt(e['model_saved_pts'], '+6.1f'):>6} {_verdict(e['saved_pass']):4} {fx:>7} "
            f"{_fmt(e['framework_speedup'], '6.2f'):>6} "
            f"{_fmt(None if e['speedup_diff'] is None else 100 * e['speedup_diff'], '+6.1f%'):>7} "
            f"{_verdict(e['speedup_pass']):4}  {e['status'][:70]}")
    if any(e["front_speedup"] is None for e in entries):
        lines.append("  n/m: speed-up not measured by the study (no throughput reference)")
    for basis in dict.fromkeys(e["front_saved_basis"] for e in entries):
        lines.append(f"  front saved: {basis}" if "'s run at " in basis else
                     f"  front saved: the study's saving on the {basis}")
    for basis in dict.fromkeys(e.get("front_speedup_basis", "the probe's") for e in entries):
        lines.append(f"  front x: {basis}")
    lines += [f"  trial {e['trial']} in {e['framework']} (the study's target) runs otherwise: "
              + "; ".join(e["runs_otherwise"]) for e in entries if e["runs_otherwise"]]
    return "\n".join(lines)


def main_from_study(args: argparse.Namespace) -> int:
    """``--from-study``: each study's picks in its frameworks beside their BF16 runs, the table, the JSON."""
    start = time.perf_counter()
    allowed = [f for f in args.frameworks if f in plan.FRAMEWORKS]
    studies, all_rows, all_entries = [], [], []
    for study_dir in args.from_study:
        study = read_study(study_dir, args.trials, args.max_picks)
        shape, depth = study_shape(args, study["model"], study["probe_seq"], study["probe_mb"])
        run_args = argparse.Namespace(**{**vars(args), "shape": shape})
        run_list = study_runs(study, shape.layers, allowed)
        s = shape
        target = study["target"] or "none (every framework that runs a trial as it is)"
        numbers = ", ".join(str(p["trial"]) for p in study["picks"]) or "none"
        print(f"\nstudy {study['study']} ({study_dir}): target {target}; {len(study['picks'])} trial(s): {numbers}"
              f"{' (--trials)' if args.trials else ' (the front)'}")
        print(f"  shape: {depth}: {s.layers} blocks, dim {s.dim}, ffn {s.ffn}, heads {s.heads}/{s.kv_heads}, "
              f"vocab {s.vocab}, seq {s.seq}, mb {s.mb}, {s.steps} steps")
        print(f"  the front's figures: its probe ran {study['probe_layers']} blocks at seq {study['probe_seq']}, "
              f"mb {study['probe_mb']}; memory saved on the {study['memory_basis']} model; speed-up on the probe")
        for pick in study["picks"]:
            print(f"  trial {pick['trial']}: runs in {', '.join(pick['frameworks']) or 'no framework'}"
                  + "".join(f"; skipped {k['framework']}: {k['why']}" for k in pick["skipped"]))
        with tempfile.TemporaryDirectory(prefix="bench_frameworks_study_") as tmp:
            rows = bench(run_args, Path(tmp), run_list, start) if run_list else []
        entries = study_report(study, rows, shape.layers)
        for r in rows:
            r["study"] = study["study"]
        print(table(rows) if rows else "  nothing to run")
        if entries:
            print(f"\nthe front against the framework (each against its own BF16 run): memory saved in points "
                  f"(diff = front - framework, within +-{SAVED_PTS_TOLERANCE:g}; model = precsearch's memory model "
                  f"for the framework's run), FP8 speed-up (diff = front / framework - 1, within "
                  f"+-{100 * SPEEDUP_TOLERANCE:g}%)")
            print(study_table(entries))
        studies.append({k: v for k, v in study.items() if k != "model"} | {
            "model": None if study["model"] is None else {"dim": study["model"].dim, "n_layers":
                                                          study["model"].n_layers},
            "shape": plan.shape_dict(shape), "depth": depth})
        all_rows += rows
        all_entries += entries
    plan.EXTRA_POLICIES.clear()
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "smoke": args.smoke,
            "deadline_s": args.deadline, "run_timeout_s": args.run_timeout, "optimizer": args.optimizer,
            "from_study": [str(d) for d in args.from_study], "trials": args.trials,
            "max_picks": args.max_picks,
            "tolerance": {"saved_pts": SAVED_PTS_TOLERANCE, "speedup": SPEEDUP_TOLERANCE}}
    kind = "cpu" if args.smoke else "gpu"
    path = args.json or Path("benchmarks/results") / (f"{datetime.date.today().isoformat()}_{kind}_"
                                                   "bench_frameworks_from_study.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "studies": studies, "rows": all_rows, "from_study": all_entries},
                               indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
