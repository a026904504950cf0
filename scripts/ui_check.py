"""Look at a finished study the way a user does: `precsearch ui` in headless Chromium (not run in CI).

Starts `precsearch ui` on a study's output directory (or first runs a space into a temporary one),
then, against the MLflow REST API and the page each URL renders (`chromium --dump-dom`), checks that:

* the runs table opens in model-training mode with the objective columns (memory_saved,
  instability, tokens_per_s, gap_in_noise, pareto, feasible) and the front trials as rows;
* the front view (`tags.pareto = 'true'`) lists exactly the front trials `precsearch front` prints;
* a front trial's run page shows its metrics, and its artifacts (loss chart, policy table) and the
  study run's front plot and page open in the artifact viewer.

It saves a screenshot of each page under --results (committed under scripts/results/ and embedded in
the README) and prints one line per check; exit status 1 if a check failed. Needs Chromium
(Debian's package; installed with apt-get when missing and running as root).

    python scripts/ui_check.py --space search_spaces/quickstart.yaml
    python scripts/ui_check.py --output-dir precsearch-runs/quickstart
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from precsearch.tracking.experiment_view import experiment_url  # noqa: E402

OBJECTIVE_COLUMNS = ("memory_saved", "instability", "tokens_per_s", "gap_in_noise", "pareto", "feasible")


def chromium() -> str:
    """The Chromium binary, installing Debian's package if it is missing."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0:
        sys.exit("ui_check: Chromium is missing; install it (Debian: apt-get install -y chromium)")
    subprocess.run(["apt-get", "install", "-y", "chromium"], check=True,
                   env=os.environ | {"DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which("chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def precsearch(*args: str, **kwargs) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "precsearch", *args], env=env, **kwargs)


def api(base: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def wait_up(base: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"ui_check: precsearch ui exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    sys.exit(f"ui_check: the MLflow UI did not answer within {timeout_s:.0f} s")


def page(browser: str, url: str, screenshot: Path | None, budget_ms: int, timeout_s: float = 150) -> str:
    """The DOM ``url`` renders after ``budget_ms`` of virtual time ("" if Chromium timed out); with
    ``screenshot``, also a PNG of it."""
    # --timeout stops a page that keeps a request open (virtual time waits for it) after 4x the budget
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1900,1000", f"--virtual-time-budget={budget_ms}", f"--timeout={4 * budget_ms}"]
    try:
        if screenshot is not None:
            subprocess.run(common + [f"--screenshot={screenshot}", url], capture_output=True, timeout=timeout_s,
                           check=True)
        return subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True, timeout=timeout_s,
                              check=True).stdout
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
        print(f"Chromium failed on {url}: {exc}", flush=True)
        return ""


def trial_names(dom: str) -> set[int]:
    return {int(n) for n in re.findall(r">trial-(\d+)<", dom)}


class Checks:
    def __init__(self):
        self.results: list[dict] = []

    def __call__(self, name: str, ok: bool, detail: str = "") -> None:
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}  {name}{'  (' + detail + ')' if detail else ''}", flush=True)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r["ok"])


def study_front(output_dir: Path) -> set[int]:
    """The front `precsearch front` prints (from the Optuna study, not from MLflow)."""
    import optuna

    from precsearch.search.front import trial_rows
    from precsearch.runtime.workspace import Workspace

    ws = Workspace.load(output_dir)
    study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    return {r["trial"] for r in trial_rows(study, study.user_attrs["objectives"]) if r["pareto"]}


def run_checks(base: str, output_dir: Path, browser: str, results: Path, prefix: str, budget_ms: int) -> Checks:
    from precsearch.runtime.workspace import Workspace

    check = Checks()
    ws = Workspace.load(output_dir)
    experiment = api(base, f"experiments/get-by-name?experiment_name={ws.experiment}")["experiment"]
    eid = experiment["experiment_id"]
    runs = api(base, "runs/search", {"experiment_ids": [eid], "max_results": 1000})["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs}
    front = study_front(output_dir)
    api_front = api(base, "runs/search", {"experiment_ids": [eid], "filter": "tags.pareto = 'true'"}).get("runs", [])
    check("REST: tags.pareto = 'true' returns the front trials", {int(tags[r["info"]["run_id"]]["trial_number"])
                                                                 for r in api_front} == front, f"front {sorted(front)}")
    kind = {t["key"]: t["value"] for t in experiment.get("tags", [])}.get("mlflow.experimentKind")
    check("experiment tag mlflow.experimentKind = custom_model_development", kind == "custom_model_development")

    dom = page(browser, experiment_url(base, eid), results / f"{prefix}_experiment.png", budget_ms)
    check("runs table: model-training mode (Runs tab, no Traces overview)", ">Runs<" in dom and ">Overview<" not in dom)
    missing = [c for c in OBJECTIVE_COLUMNS if f">{c}<" not in dom]
    check("runs table: objective columns on screen", not missing, f"missing {missing}" if missing else "")
    shown = trial_names(dom)
    check("runs table: every front trial is a row", front <= shown, f"rows {sorted(shown)}")

    dom = page(browser, experiment_url(base, eid, front=True), results / f"{prefix}_front_filter.png", budget_ms)
    shown = trial_names(dom)
    check("front view: exactly the front trials", shown == front, f"rows {sorted(shown)}")

    dom = page(browser, experiment_url(base, eid, charts=True), results / f"{prefix}_charts.png", budget_ms)
    check("chart view: the trade-off section is there", "precsearch trade-off" in dom)

    best = _best_front_run(runs, tags)
    parent = next(rid for rid, t in tags.items() if t.get("precsearch.role") == "study")
    route = f"{base}/#/experiments/{eid}/runs"
    dom = page(browser, f"{route}/{best}?workflowType=machine_learning", results / f"{prefix}_trial.png", budget_ms)
    check("trial page: its metrics are on screen", "memory_saved" in dom and "instability" in dom)
    # policy.md last: headless Chromium sometimes never settles on MLflow's Markdown viewer
    for name, run, path in (("trial_loss", best, "loss_curves.png"), ("study_front", parent, "front/front.png"),
                            ("study_front_html", parent, "front/front.html"), ("trial_policy", best, "policy.md")):
        dom = page(browser, f"{route}/{run}/artifacts/{path}?workflowType=machine_learning",
                   results / f"{prefix}_{name}.png", budget_ms)
        check(f"artifact viewer opens {path}", path.split("/")[-1] in dom)
    return check


def _best_front_run(runs: list[dict], tags: dict[str, dict]) -> str:
    """The front trial run that saves the most memory."""
    def saved(run: dict) -> float:
        metrics = {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
        return metrics.get("memory_saved", -1.0)

    front = [r for r in runs if tags[r["info"]["run_id"]].get("pareto") == "true"]
    return max(front, key=saved)["info"]["run_id"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--output-dir", type=Path, help="a finished study's output directory")
    which.add_argument("--space", type=Path, help="run this space into a temporary directory first")
    parser.add_argument("--results", type=Path, default=REPO / "scripts" / "results", help="where screenshots go")
    parser.add_argument("--prefix", default=f"{date.today().isoformat()}_ui", help="screenshot file name prefix")
    parser.add_argument("--budget-ms", type=int, default=30000, help="virtual time each page gets to render")
    args = parser.parse_args()
    browser = chromium()
    output_dir = args.output_dir
    if output_dir is None:
        output_dir = Path(tempfile.mkdtemp(prefix="ui_check_")) / "study"
        if precsearch("run", str(args.space), "--output-dir", str(output_dir), "--no-progress").wait() != 0:
            return 1
    args.results.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = precsearch("ui", "--output-dir", str(output_dir), "--port", str(port), start_new_session=True,
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_up(base, server)
        check = run_checks(base, output_dir, browser, args.results, args.prefix, args.budget_ms)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    (args.results / f"{args.prefix}_checks.json").write_text(json.dumps(check.results, indent=1) + "\n")
    print(f"{len(check.results) - check.failed} of {len(check.results)} checks passed; screenshots in {args.results}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
