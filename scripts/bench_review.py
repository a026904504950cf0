"""What the review artifacts cost per trial (issue 15): each piece timed on a finished study's results.

Times, as the median of --repeats calls, what a trial's recording renders: the loss chart, the policy
and memory tables, the front update (PNG and page, with the study's rows repeated to --rows trials), and,
for scale, the signals plot that was there before, and the former front (PNG and plotly page) if
--old-front names a copy of the former ``front_report.py`` (skipped without plotly, which precsearch no
longer depends on). Prints a table; writes JSON with --json.

    python scripts/bench_review.py --output-dir /tmp/smoke --json scripts/results/review_cost.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

from precsearch.policy import Policy  # noqa: E402
from precsearch.probe.result import ProbeResult  # noqa: E402
from precsearch.search.front import trial_rows  # noqa: E402
from precsearch.runtime.workspace import Workspace  # noqa: E402
from precsearch.tracking.front_report import write_front  # noqa: E402
from precsearch.tracking.signals_report import trial_signals  # noqa: E402
from precsearch.tracking.trial_report import loss_curves, memory_table, policy_table  # noqa: E402


def median_s(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", type=Path, required=True, help="a finished study")
    parser.add_argument("--rows", type=int, default=12, help="trials on the front plot")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--old-front", type=Path, help="a copy of the former tracking/front_report.py")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ws = Workspace.load(args.output_dir)
    study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    trial = next(t for t in study.trials if "probe_result" in t.user_attrs)
    result = ProbeResult.from_dict(trial.user_attrs["probe_result"])
    reference = ProbeResult.from_dict(json.loads(sorted(ws.references_dir.glob("*.json"))[0].read_text()))
    policy = Policy.from_dict(trial.user_attrs["policy"])
    base = trial_rows(study, study.user_attrs["objectives"])
    rows = [dict(base[i % len(base)], trial=i) for i in range(args.rows)]
    n_layers = study.user_attrs["space"]["model"]["n_layers"] or 2
    out = Path(tempfile.mkdtemp(prefix="bench_review_"))
    loss_curves(result, reference)  # matplotlib's import and first figure are paid once per process
    timings = {
        "loss_curves.png": median_s(lambda: loss_curves(result, reference, "trial:"), args.repeats),
        "policy.md + memory.md": median_s(lambda: (policy_table(policy, n_layers), memory_table(result, reference)),
                                          args.repeats),
        f"front png + html ({args.rows} trials)": median_s(lambda: write_front(rows, out / "new", 0.01),
                                                           args.repeats),
        "signals.png (there before)": median_s(lambda: trial_signals(result.signals, reference.signals,
                                                                     [reference.signals]), args.repeats),
    }
    if args.old_front is not None and importlib.util.find_spec("plotly") is None:
        print("former front skipped: plotly is not installed (precsearch no longer needs it; pip install plotly)")
    elif args.old_front is not None:
        spec = importlib.util.spec_from_file_location("old_front", args.old_front)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        timings[f"former front png + plotly html ({args.rows} trials)"] = median_s(
            lambda: old.write_front(rows, out / "old", 0.01), args.repeats)
    load = os.getloadavg()[0]
    for name, seconds in timings.items():
        print(f"{name:44s} {seconds:7.3f} s")
    print(f"(load average {load:.1f} on {os.cpu_count()} CPUs)")
    if args.json:
        args.json.write_text(json.dumps({"seconds": timings, "load_average": load, "cpus": os.cpu_count(),
                                         "rows": args.rows, "repeats": args.repeats}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
