"""How long `precsearch run` takes to end after Ctrl-C (issue 53: "Ctrl-C within 1 s").

Starts the command as a user's shell does (its own process group), waits until a trial runs (its first
trial line, then ``--delay`` s more), sends SIGINT to the group, as a terminal's Ctrl-C does, and times the
exit. Each row runs the command ``--repeats`` times into a fresh output directory; the table gives every
latency, and the JSON the lines printed after the signal.

    python benchmarks/bench_ctrl_c.py --out benchmarks/results --prefix DATE_cpu
    python benchmarks/bench_ctrl_c.py --spaces search_spaces/cpu_smoke.yaml --workers 2 --repeats 1   # quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: A finished trial's line, from the run itself or relayed from a worker (``[w1] trial 3: memory saved ...``).
TRIAL_LINE = re.compile(r"^(\[w\d+\] )?trial \d+: memory saved")


def one_stop(space: str, workers: int, delay_s: float, timeout_s: float) -> dict:
    """Run ``space`` with ``workers``, Ctrl-C it ``delay_s`` after its first trial line; the latency and lines."""
    out = Path(tempfile.mkdtemp(prefix="bench_ctrl_c_"))
    cmd = [sys.executable, "-m", "precsearch", "run", space, "--output-dir", str(out), "--no-progress"]
    cmd += ["--workers", str(workers)] if workers > 1 else []
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line.rstrip()) for line in proc.stdout),
                              daemon=True)
    reader.start()
    started = time.monotonic()
    try:
        while not any(TRIAL_LINE.match(text) for _, text in lines):
            if proc.poll() is not None or time.monotonic() - started > timeout_s:
                raise RuntimeError(f"no trial line from {' '.join(cmd)}; it printed:\n" +
                                   "\n".join(text for _, text in lines[-20:]))
            time.sleep(0.05)
        time.sleep(delay_s)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} ended before the Ctrl-C; use a smaller --delay")
        code = proc.wait(timeout=60)
        latency = time.monotonic() - sent
        reader.join(timeout=5)
        return {"latency_s": round(latency, 3), "exit": code,
                "after": [f"+{t - sent:.2f}s {text}" for t, text in lines if t >= sent]}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", nargs="+", default=["search_spaces/quickstart.yaml", "search_spaces/cpu_smoke.yaml"])
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delay", type=float, default=1.0, help="seconds after the first trial line (default 1)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a trial line")
    ap.add_argument("--out", type=Path, help="folder for PREFIX_bench_ctrl_c.json")
    ap.add_argument("--prefix", default=datetime.date.today().isoformat() + "_cpu")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    rows = []
    print(f"{'space':<34} {'workers':>7}  latencies (s)            exit   load before: {load:.1f}")
    for space in args.spaces:
        for workers in args.workers:
            runs = [one_stop(space, workers, args.delay, args.timeout) for _ in range(args.repeats)]
            latencies = [r["latency_s"] for r in runs]
            rows.append({"space": space, "workers": workers, "latencies_s": latencies,
                         "median_s": statistics.median(latencies), "exits": [r["exit"] for r in runs], "runs": runs})
            print(f"{space:<34} {workers:>7}  {', '.join(f'{x:.2f}' for x in latencies):<24} "
                  f"{','.join(str(r['exit']) for r in runs)}", flush=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "cpus": os.cpu_count(), "load_before": load, "load_after": os.getloadavg()[0],
              "delay_s": args.delay, "rows": rows}
    print(f"load after: {report['load_after']:.1f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{args.prefix}_bench_ctrl_c.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")
    return 0 if all(c == 130 for r in rows for c in r["exits"]) else 1


if __name__ == "__main__":
    sys.exit(main())
