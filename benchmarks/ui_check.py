"""Look at a finished study the way a user does: `precsearch ui` in headless Chromium (not run in CI).

Starts `precsearch ui` on a study's output directory (or first runs a space into a temporary one),
then, against the MLflow REST API and the page each URL renders (`chromium --dump-dom`), checks
every page a user reaches from the links `precsearch ui` prints:

* the banner: every link a URL in model-training mode, the front plot and page included, and no
  access-log line or Starlette warning from the server;
* the runs table: model-training mode (no Judges/Evaluations), the flag and objective columns
  (feasible, pareto, memory_saved_pct, instability_in_unit, tokens_per_s, and
  gap_in_noise where the study has a noise floor), each front trial's saving as the terminal rounds it, feasible trials above the
  others, front trials named ``trial-N (front)``;
* the front view (`tags.pareto = 'true'`): exactly the front trials `precsearch front` prints;
* the chart view: the trade-off section, and every trial's name in the chart legends;
* the best front trial's page (its objectives in percent) and artifacts (loss chart, memory.md whose
  tables add up, breakdown.png, policy.md), and the study run's front.png and front.html (its table
  in the plot's unit), each in model-training mode.

It saves a small screenshot of each page under --results (palette PNGs, at most about 150 KB) and
prints one line per check; exit status 1 if a check failed. Needs Chromium (Debian's package;
installed with apt-get when missing and running as root).

    python benchmarks/ui_check.py --space search_spaces/quickstart.yaml
    python benchmarks/ui_check.py --output-dir precsearch-runs/quickstart
"""

from __future__ import annotations

import argparse
import json
import math
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

from precsearch.tracking.experiment_view import artifact_url, experiment_url, run_url  # noqa: E402
from precsearch.tracking.review_columns import instability_column  # noqa: E402

#: Sidebar and breadcrumb entries MLflow 3.17 shows only in its GenAI mode.
GENAI_MARKERS = (">Judges<", ">Evaluations<", ">Evaluation runs<")
MAX_PNG_BYTES = 150_000


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
    ``screenshot``, also a PNG of it. Each call gets a new empty profile: a fresh browser, as a new user's,
    whose stored MLflow mode is the default (GenAI)."""
    # --timeout stops a page that keeps a request open (virtual time waits for it) after 4x the budget
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--hide-scrollbars", "--window-size=1600,1000", f"--virtual-time-budget={budget_ms}",
              f"--timeout={4 * budget_ms}"]
    try:
        if screenshot is not None:
            with tempfile.TemporaryDirectory() as profile:
                subprocess.run(common + [f"--user-data-dir={profile}", f"--screenshot={screenshot}", url],
                               capture_output=True, timeout=timeout_s, check=True)
            shrink(screenshot)
        with tempfile.TemporaryDirectory() as profile:
            return subprocess.run(common + [f"--user-data-dir={profile}", "--dump-dom", url], capture_output=True,
                                  text=True, timeout=timeout_s, check=True).stdout
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
        print(f"Chromium failed on {url}: {exc}", flush=True)
        return ""


def shrink(path: Path) -> None:
    """Rewrite a screenshot as a palette PNG, narrower until it is at most :data:`MAX_PNG_BYTES`."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    for width in (image.width, 1300, 1100, 900):
        small = image if width == image.width else image.resize((width, round(image.height * width / image.width)))
        small.quantize(colors=192).save(path, optimize=True)  # fewer merged the trials' colours
        if path.stat().st_size <= MAX_PNG_BYTES:
            return


def training_mode(dom: str) -> bool:
    """MLflow's model-training mode: the page rendered, with none of the GenAI mode's entries."""
    return ">Runs<" in dom and not any(marker in dom for marker in GENAI_MARKERS)


def trial_names(dom: str) -> set[int]:
    return {int(n) for n in re.findall(r">trial-(\d+)(?: \(front\))?<", dom)}


def trial_order(dom: str) -> list[int]:
    """Trial numbers in the order their names first appear (the table's row order)."""
    seen: list[int] = []
    for n in re.findall(r">trial-(\d+)(?: \(front\))?<", dom):
        if int(n) not in seen:
            seen.append(int(n))
    return seen


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


def run_checks(base: str, output_dir: Path, browser: str, results: Path, prefix: str, budget_ms: int,
               banner: str) -> Checks:
    from precsearch.runtime.workspace import Workspace

    check = Checks()
    ws = Workspace.load(output_dir)
    experiment = api(base, f"experiments/get-by-name?experiment_name={ws.experiment}")["experiment"]
    eid = experiment["experiment_id"]
    runs = api(base, "runs/search", {"experiment_ids": [eid], "max_results": 1000})["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs}
    metrics = {r["info"]["run_id"]: {m["key"]: m["value"] for m in r["data"].get("metrics", [])} for r in runs}
    trials = {int(t["trial_number"]): rid for rid, t in tags.items() if t.get("precsearch.role") == "trial"}
    front = study_front(output_dir)
    unit = next(t.get("stability_unit", "relative") for t in tags.values() if t.get("precsearch.role") == "trial")
    # the unit's name as every output words it (a damage study's goes on with its measure)
    unit_name = next(t.get("instability_unit", "") for t in tags.values() if t.get("precsearch.role") == "trial")
    _check_banner(check, banner)
    api_front = api(base, "runs/search", {"experiment_ids": [eid], "filter": "tags.pareto = 'true'"}).get("runs", [])
    check("REST: tags.pareto = 'true' returns the front trials", {int(tags[r["info"]["run_id"]]["trial_number"])
                                                                 for r in api_front} == front, f"front {sorted(front)}")
    _check_table(check, page(browser, experiment_url(base, eid), results / f"{prefix}_experiment.png", budget_ms),
                 front, trials, tags, metrics, unit)

    dom = page(browser, experiment_url(base, eid, front=True), results / f"{prefix}_front_filter.png", budget_ms)
    check("front view: model-training mode", training_mode(dom))
    check("front view: exactly the front trials", trial_names(dom) == front, f"rows {sorted(trial_names(dom))}")

    dom = page(browser, experiment_url(base, eid, charts=True), results / f"{prefix}_charts.png", budget_ms)
    check("chart view: model-training mode, the trade-off section", training_mode(dom)
          and "precsearch trade-off" in dom)
    named = set(re.findall(r">trial-(\d+ \(front\))<", dom))
    check("chart view: the front trials named '(front)'", {f"{n} (front)" for n in front} <= named,
          f"marked {sorted(named)}")
    # the run list beside the charts, with each run's colour (MLflow's legend under a chart may show fewer)
    check("chart view: every trial in the run list beside the charts", set(trials) <= trial_names(dom),
          f"missing {sorted(set(trials) - trial_names(dom))}")

    best = _best_front_run(runs, tags)
    parent = next(rid for rid, t in tags.items() if t.get("precsearch.role") == "study")
    dom = page(browser, run_url(base, eid, best), results / f"{prefix}_trial.png", budget_ms)
    check("trial page: model-training mode", training_mode(dom))
    check("trial page: its objectives in percent", f">{metrics[best]['memory_saved_pct']:g}<" in dom
          and "memory_saved_pct" in dom and instability_column(unit) in dom)
    _check_artifacts(check, browser, base, eid, best, parent, results, prefix, budget_ms, unit_name)
    return check


def _check_banner(check: Checks, banner: str, when: str = "") -> None:
    # the links of the banner, not the start line or the server's "Uvicorn running on" line before it
    urls = re.findall(r"http://\S+", banner.partition("(Ctrl-C to stop):")[2])
    if when:  # the output again after every page was opened: the requests must have added no lines
        noise = [line for line in banner.splitlines() if '"GET /' in line or "DeprecationWarning" in line]
        check(f"ui output {when}: no access-log lines or Starlette warnings", not noise, f"{len(noise)} lines")
        return
    check("banner: every link opens in model-training mode", len(urls) >= 5
          and all("workflowType=machine_learning" in u for u in urls), f"{len(urls)} links")
    check("banner: the front plot and page are URLs", any(u.endswith("front.png?workflowType=machine_learning")
                                                          for u in urls)
          and any(u.endswith("front.html?workflowType=machine_learning") for u in urls))
    noise = [line for line in banner.splitlines() if '"GET /' in line or "DeprecationWarning" in line]
    check("banner: no access-log lines or Starlette warnings", not noise, f"{len(noise)} lines" if noise else "")


def _check_table(check: Checks, dom: str, front: set[int], trials: dict[int, str], tags: dict, metrics: dict,
                 unit: str) -> None:
    check("runs table: model-training mode (Runs, no Judges/Evaluations)", training_mode(dom))
    columns = ("feasible", "pareto", "memory_saved_pct", instability_column(unit), "tokens_per_s")
    missing = [c for c in columns if f">{c}<" not in dom]
    check("runs table: flag and objective columns on screen", not missing, f"missing {missing}" if missing else "")
    # the loss gap in seed spreads only where a trial has a noise floor (2+ BF16 seeds): else an empty column
    noise = any(math.isfinite(float(metrics[rid].get("noise_floor", math.nan))) for rid in trials.values())  # REST: "NaN"
    check(f"runs table: gap_in_noise {'on screen (a noise floor)' if noise else 'not shown (no noise floor)'}",
          (">gap_in_noise<" in dom) == noise)
    shown = [f"{metrics[trials[n]]['memory_saved_pct']:g}" for n in sorted(front)]
    check("runs table: front trials' savings in percent, as the terminal rounds them",
          all(f">{v}<" in dom for v in shown), f"{shown}")
    check("runs table: every front trial a row, named '(front)'", all(f">trial-{n} (front)<" in dom for n in front))
    order = [n for n in trial_order(dom) if n in trials]
    feasible = [tags[trials[n]].get("feasible") == "true" for n in order]
    check("runs table: feasible trials above the others", feasible == sorted(feasible, reverse=True),
          f"rows {order}")


def _check_artifacts(check: Checks, browser: str, base: str, eid: str, best: str, parent: str, results: Path,
                     prefix: str, budget_ms: int, unit_name: str) -> None:
    header = f"instability ({unit_name})"
    # policy.md last: headless Chromium sometimes never settles on MLflow's Markdown viewer
    for name, run, path, needs in (
            ("trial_loss", best, "loss_curves.png", "loss_curves.png"),
            ("trial_memory", best, "memory.md", "backward total"),
            ("trial_breakdown", best, "memory/breakdown.png", "breakdown.png"),
            ("study_front", parent, "front/front.png", "front.png"),
            ("study_front_html", parent, "front/front.html", "front.html"),
            ("trial_policy", best, "policy.md", "policy.md")):
        shot = None if name == "trial_policy" else results / f"{prefix}_{name}.png"  # at most 10 files in all
        dom = page(browser, artifact_url(base, eid, run, path), shot, budget_ms)
        check(f"artifact viewer opens {path} in model-training mode", needs in dom and training_mode(dom))
    page_text = _artifact_text(base, parent, "front/front.html")
    check("front.html: its table in the plot's unit", f"<th>{header}" in page_text, header)


def _artifact_text(base: str, run_id: str, path: str) -> str:
    url = f"{base}/get-artifact?path={path}&run_uuid={run_id}"
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode(errors="replace")


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
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results", help="where screenshots go")
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
    log = Path(tempfile.mkdtemp(prefix="ui_check_log_")) / "ui.log"
    with log.open("w") as out:  # what the user's terminal shows: stdout and stderr together
        server = precsearch("ui", "--output-dir", str(output_dir), "--port", str(port), start_new_session=True,
                            stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_up(base, server)
        deadline = time.monotonic() + 60
        while "front plot" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        check = run_checks(base, output_dir, browser, args.results, args.prefix, args.budget_ms, log.read_text())
        _check_banner(check, log.read_text(), when="after every page")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    print("precsearch ui printed:\n" + log.read_text(), flush=True)
    (args.results / f"{args.prefix}_checks.json").write_text(json.dumps(check.results, indent=1) + "\n")
    print(f"{len(check.results) - check.failed} of {len(check.results)} checks passed; screenshots in {args.results}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
