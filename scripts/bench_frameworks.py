"""The exported policy where users train it: Megatron-Core, torchtitan (torchao) and Accelerate, on one GPU.

For each policy of :data:`frameworks_plan.POLICIES` (BF16, uniform FP8 current, attention current + MLP
delayed, BF16 first/last blocks, BF16 moments with the precision-aware optimizer, MXFP8) and each framework,
precsearch's own export code writes the files, then a fresh process (``scripts/frameworks_runs.py``, one per
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

    python scripts/bench_frameworks.py --json $OUT/bench_frameworks.json
    python scripts/bench_frameworks.py --smoke --json /tmp/frameworks_smoke.json
    python scripts/bench_frameworks.py --layers 32 --frameworks megatron --policies bf16 fp8_current \\
        --memory-breakdown --optimizer adamw      # the full 8B depth: torch AdamW on BF16 params fits one H200
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
    ap.add_argument("--json", type=Path, help="default: scripts/results/<date>_<gpu|cpu>_bench_frameworks.json")
    args = ap.parse_args(argv)
    if args.calibrate and not args.merge:
        ap.error("--calibrate needs --merge (it calibrates merged rows of earlier runs)")
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
    export_dir = workdir / f"{framework}__{policy_name}".replace("+", "_")
    row["export_dir"] = str(export_dir)
    fmt = "megatron" if framework == "probe" else framework
    files, row["export_warnings"] = plan.export_files(fmt, policy, shape.layers, export_dir)
    row["files"] = sorted(files)
    if fmt == "megatron":
        mplan = plan.megatron_plan(policy, shape.layers)
        row["config"] = {k: mplan[k] for k in ("transformer", "optimizer", "ddp", "quant_recipe")}
        row["files_check"] = plan.check_modules(plan.megatron_decided(files, shape.layers),
                                                plan.megatron_expected(policy, shape.layers))
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


def run_one(row: dict[str, Any], shape: plan.Shape, timeout: float) -> dict[str, Any]:
    """Train in a fresh process; its result, or the row's ``error`` (timeout, crash, exception)."""
    spec = {"framework": row["framework"], "policy": row["policy"], "shape": plan.shape_dict(shape),
            "export_dir": row["export_dir"], "optimizer": row.get("optimizer", "framework")}
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
    return "\n".join(lines)


def bench(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """Prepare every run, then (not ``--smoke``) train each in its own process until the deadline."""
    start = time.perf_counter()
    rows = []
    for framework, policy_name in runs(args):
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
    path = args.json or Path("scripts/results") / f"{datetime.date.today().isoformat()}_{kind}_bench_frameworks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows, "agreement": entries}, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
