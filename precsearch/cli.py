"""The ``precsearch`` command line: run, validate, front, export, ui."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from precsearch.version import __version__
from precsearch.cli_checks import at_least, at_most, check_fraction, check_gpus_present, check_workers
from precsearch.errors import UserError
from precsearch.export.pick import DEFAULT_MARGIN, PICKS
from precsearch.export.registry import FORMATS
from precsearch.policy.rules import PrecisionConflict
from precsearch.runtime.stopping import RESUME_HINT, WORKER_DONE
from precsearch.utils import trace
from precsearch.utils.numbers import MAX_LAYERS
from precsearch.utils.processes import dump_stacks_on_signal
from precsearch.utils.writable import check_writable

STARTED = time.time()  # near this process's start (the imports above are light): the timeline's start-up span
EXIT_USER_ERROR = 2


def _load_checked_space(path: Path, gpu: bool = True):
    """The space at ``path``, every check passed (``gpu=False``: all but those of :func:`gpu_checks_left`)."""
    space = _load_space_file(path)
    _check_on_this_machine(space, path, gpu)
    return space


def _load_space_file(path: Path):
    """The space at ``path``, the file's own checks passed (fields, groups, units), nothing of this machine's."""
    from precsearch.config.checks import check_space
    from precsearch.config.loader import load_space

    from precsearch.runtime.target_space import check_target

    space = load_space(path)
    check_space(space, file=str(path))
    check_target(space, file=str(path))  # after the file's own checks: it asks the export about each choice
    return space


def _print_soak_warnings(space) -> None:
    """One line per optimizer state or GEMM recipe offered that no long run has passed (``search.allow_unsoaked``),
    and one per searched setting whose values the study's reading cannot tell apart."""
    from precsearch.config.inert import reading_warnings
    from precsearch.config.soak_checks import soak_warnings

    for warning in soak_warnings(space) + reading_warnings(space):
        print(f"warning: {warning}", file=sys.stderr)


def _check_on_this_machine(space, path: Path, gpu: bool = True) -> None:
    """The space's checks on this machine: files, data, backend, GPUs (``gpu=False``: no GPU's)."""
    from precsearch.runtime.preflight import preflight

    preflight(space, file=str(path), gpu=gpu)
    _print_soak_warnings(space)  # once every check passed: a refused space says only why
    if gpu:
        _print_emulation_note(space)


def _print_emulation_note(space) -> None:
    """Say so when Blackwell recipes will run emulated (their speed and memory are then not a B200's)."""
    from precsearch.backends import chosen_backend
    from precsearch.backends.capability import emulation_note

    precisions = space.search.precisions()
    backend, device = chosen_backend(space.backend.value, space.probe.device, precisions)
    note = emulation_note(backend, precisions, device)
    if note:
        print(note, file=sys.stderr)


def _stopped() -> int:
    """Say how to resume; from here on a further Ctrl-C ends the process at once (status 130)."""
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
    print(f"\n{RESUME_HINT}", file=sys.stderr)
    return 130


def cmd_validate(args: argparse.Namespace) -> int:
    from precsearch.runtime.preflight import gpu_checks_left
    from precsearch.config.loader import load_space

    left = gpu_checks_left(load_space(args.space))  # a GPU space on a CPU machine: check all else here
    space = _load_checked_space(args.space, gpu=not left)
    cfg = space.model.probe()
    knobs = sum(1 for g in space.search.groups if not g.precision.is_fixed)
    print(f"{args.space}: valid{' on this machine (file, fields, checkpoint and data)' if left else ''}. Probe: "
          f"{cfg.n_layers} layers, dim {cfg.dim}, {space.probe.steps} steps; "
          f"{len(space.search.groups)} layer groups ({knobs} searched); backend {space.backend.value}.")
    if space.target is not None:
        from precsearch.runtime.target_space import target_line

        print(target_line(space.model_dump(mode="json")))
    if left:
        print("Not checked here, no CUDA GPU on this machine: run 'precsearch validate' on the GPU machine for\n"
              + "\n".join(f"  - {check}" for check in left))
        return 0
    if space.backend.value == "auto":
        from precsearch.backends import chosen_backend

        chosen, _ = chosen_backend("auto", space.probe.device, space.search.precisions())
        print(f"backend auto runs {chosen} here.")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    at_least("--n-trials", args.n_trials, 1, "the study's total of finished trials")
    if args.output_dir is not None:  # before the space's data is read (the default dir is checked by run_study)
        check_writable(args.output_dir, "--output-dir", directory=True)
    space = _load_space_file(args.space)
    check_workers(args.workers, args.gpus is not None, space.probe.nproc)
    executor = None
    if args.workers == 1 and args.gpus is None and space.probe.nproc == 1:
        from precsearch.runtime.executor import probe_process

        # the probe process imports torch and the backend and loads the data while this one checks the
        # space on this machine (the same imports) and opens the stores: seconds less before the first probe
        executor = probe_process(space)
    try:
        return _run(args, space, executor)
    finally:
        if executor is not None:
            executor.close()


def _run(args: argparse.Namespace, space, executor) -> int:
    from precsearch.search.front import format_table, nearest_to_feasible, no_front_text
    from precsearch.runtime.launcher import parse_gpus
    from precsearch.runtime.study import run_study

    _check_on_this_machine(space, args.space)
    gpus = parse_gpus(args.gpus)
    check_gpus_present(args.gpus)
    trace.write("study process: start-up", STARTED, time.time())
    try:
        rows = run_study(space, args.space.read_text(), args.output_dir, n_trials=args.n_trials,
                         progress=not args.no_progress, workers=args.workers, gpus=gpus, executor=executor)
    except KeyboardInterrupt:
        return _stopped()
    from precsearch.runtime.workspace import Workspace

    from precsearch.runtime.target_space import runs_as_is_of_space, target_line

    print("\nPareto front (feasible trials no other trial beats on every objective):")
    front = runs_as_is_of_space(space, [r for r in rows if r["pareto"]])
    print(format_table(front, target=target_line(space.model_dump(mode="json"))) if front else no_front_text(rows))
    feasible = any(r["feasible"] for r in rows)
    print(next_commands(Workspace.for_space(space, args.output_dir).output_dir, feasible=feasible,
                        nearest=None if feasible else nearest_to_feasible(rows)))
    return 0


def next_commands(output_dir: Path, feasible: bool = True, nearest: dict | None = None) -> str:
    """What to run after a study: the front, the MLflow UI, the export (of the front's pick; without a feasible
    trial, where ``--pick`` has nothing to pick, the export of the trial ``nearest`` to feasible, with its
    warning)."""
    out = _shell_path(output_dir)
    # the policy lands in the study's directory: written to the current one, it sat untracked in a clone
    policy = _shell_path(Path(output_dir) / "policy.yaml")
    trial = nearest["trial"] if nearest is not None else "N"
    export = (f"  precsearch export --output-dir {out} --pick max-memory -o {policy}" if feasible else
              f"  precsearch export --output-dir {out} --trial {trial} -o {policy}   # no trial is feasible: "
              "this writes it anyway, with a warning")
    return ("\nNext:\n"
            f"  precsearch front --all --output-dir {out}     # every trial, feasible and pareto columns\n"
            f"  precsearch ui --output-dir {out}              # MLflow: trials, objectives, the front plot\n"
            + export)


def _shell_path(path: Path) -> str:
    import shlex

    try:
        path = Path(path).resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.quote(str(path))


def cmd_worker(args: argparse.Namespace) -> int:
    from precsearch.runtime.worker import run_worker

    at_least("--n-trials", args.n_trials, 1, "the study's total of finished trials")
    if args.output_dir is not None:
        check_writable(args.output_dir, "--output-dir", directory=True)
    try:
        done = run_worker(args.study, args.storage, tracking_uri=args.tracking_uri, output_dir=args.output_dir,
                          n_trials=args.n_trials, name=args.name, progress=not args.no_progress)
    except KeyboardInterrupt:
        return _stopped()
    print(f"{WORKER_DONE}the study has {done} finished trials")
    return 0


def cmd_front(args: argparse.Namespace) -> int:
    from precsearch.runtime.target_space import runs_as_is_of_study, target_line
    from precsearch.search.front import format_table, no_front_text, trial_rows

    study, _ = _open_study(args.output_dir)
    rows = trial_rows(study, study.user_attrs["objectives"])
    shown = runs_as_is_of_study(study, rows if args.all else [r for r in rows if r["pareto"]])
    target = target_line(study.user_attrs.get("space", {}))
    print(format_table(shown, flags=args.all, target=target) if shown else no_front_text(rows))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from precsearch.export.policy_export import write_export
    from precsearch.runtime.study_export import export

    at_least("--trial", args.trial, 0, "trial numbers start at 0")
    at_least("--n-layers", args.n_layers, 1, "the blocks of the model the files are for")
    at_most("--n-layers", args.n_layers, MAX_LAYERS, "the blocks of the model the files are for")
    at_least("--pipeline-parallel", args.pipeline_parallel, 1, "model chunks of the Megatron run")
    check_fraction("--max-instability", args.max_instability)
    check_fraction("--margin", args.margin)
    if args.output is not None:  # before the study is read: a path that cannot be written fails now
        check_writable(args.output, "-o/--output", directory=args.output.endswith(("/", "\\")))
    study, ws = _open_study(args.output_dir)
    result = export(study, ws, trial=args.trial, pick=args.pick, max_instability=args.max_instability,
                    margin=args.margin, fmt=args.format, n_layers=args.n_layers, pipeline=args.pipeline_parallel)
    from precsearch.search.promotion import rung_warnings

    print(f"exporting {result.reason}", file=sys.stderr)
    for warning in rung_warnings(study, result.source) + result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if result.cost is not None:  # before writing: what the framework runs differently, and its memory
        _print_export_cost(result.cost, args.format, result.trial)
    written = write_export(result.files, args.output)
    if written:
        print(f"wrote trial {result.trial} ({args.format}) to {', '.join(str(p) for p in written)}")
    else:
        for name, text in result.files.items():
            if len(result.files) > 1:
                print(f"# ==> {name} <==")
            print(text, end="")
    return 0


def _print_export_cost(cost, fmt: str, trial: int) -> None:
    """What ``fmt``'s files change from trial ``trial`` (per module, per knob) and the memory it costs."""
    if not cost.changes:
        print(f"nothing changes: {fmt} runs trial {trial}'s policy as searched", file=sys.stderr)
        return
    print(f"what {fmt} runs differently from trial {trial} (the trial's -> what is written):", file=sys.stderr)
    for line in cost.changes:
        print(f"  {line}", file=sys.stderr)
    print(f"what it costs: {cost.summary()}", file=sys.stderr)


def cmd_ui(args: argparse.Namespace) -> int:
    from precsearch.runtime.workspace import Workspace
    from precsearch.tracking import ui
    from precsearch.tracking.server import QUIET_ENV, mlflow_server_command

    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port}: valid: 1..65535", field="--port")
    ws = Workspace.load(_study_dir(args.output_dir))
    ws.follow_move()
    if args.optuna:
        return _optuna_dashboard(ws, args.host, args.port)
    try:
        cmd = mlflow_server_command(ws.tracking_uri, host=args.host, port=args.port, quiet=True)
    except ValueError as exc:
        raise UserError(str(exc), field="--host/--port") from None
    ui.check_port(args.host, args.port)
    base = f"http://{args.host}:{args.port}"
    banner = ui_banner(ws, base)
    print(f"starting the MLflow UI for study '{ws.study_name}' at {base} ...", flush=True)
    return ui.serve(cmd, env=QUIET_ENV, url=base, ready=lambda: print(banner, flush=True))


def ui_banner(ws, base_url: str) -> str:
    """Where the MLflow UI shows the study: the runs table on precsearch's views, the front trials, the charts
    and the front plot and page, each a URL that opens in model-training mode."""
    from precsearch.tracking.experiment_view import artifact_url, experiment_url

    experiment, study_run = _experiment_and_study_run(ws)
    if experiment is None:
        return f"MLflow UI for study '{ws.study_name}' at {base_url} (Ctrl-C to stop); no experiment logged yet"
    lines = [f"MLflow UI for study '{ws.study_name}' (Ctrl-C to stop):",
             f"  trials and objectives:  {experiment_url(base_url, experiment)}",
             f"  front trials only:      {experiment_url(base_url, experiment, front=True)}",
             f"  trade-off charts:       {experiment_url(base_url, experiment, charts=True)}"]
    if study_run is not None:
        lines += [f"  front plot:             {artifact_url(base_url, experiment, study_run, 'front/front.png')}",
                  f"  front table and plot:   {artifact_url(base_url, experiment, study_run, 'front/front.html')}"]
    lines.append("  (a page opened from inside MLflow that shows Evaluations or Judges is in its GenAI mode: click "
                 "'Model training' at the top of the sidebar once; the browser keeps it)")
    lines.append(ASSISTANT_NOTE)
    return "\n".join(lines)


#: MLflow 3.17 opens its Assistant panel by itself once per browser and address (local storage
#: ``mlflow.assistant.fab.autoOpenedOnFirstLoad``) when the page's host is localhost; no URL parameter or
#: server setting keeps it closed, and closing it is remembered (``mlflow.assistant.panelOpen``).
ASSISTANT_NOTE = ("  (MLflow opens its Assistant panel on the right the first time a browser opens this address: "
                  "its × at the top right closes it, and the browser keeps it closed)")


def _experiment_and_study_run(ws) -> tuple[str | None, str | None]:
    """The study's experiment id and its study run's id (None for what is not logged yet)."""
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=ws.tracking_uri)
        found = client.get_experiment_by_name(ws.experiment)
        if found is None:
            return None, None
        query = f"tags.`precsearch.role` = 'study' AND tags.`precsearch.study` = '{ws.study_name}'"
        runs = client.search_runs([found.experiment_id], query, max_results=1)
    except Exception:  # noqa: BLE001 - the banner only loses its links; the server reports store errors
        return None, None
    return found.experiment_id, runs[0].info.run_id if runs else None


def _optuna_dashboard(ws, host: str, port: int) -> int:
    """optuna-dashboard on the study's Optuna storage (the optional ``dashboard`` extra)."""
    import importlib.util

    if importlib.util.find_spec("optuna_dashboard") is None:
        raise UserError("--optuna needs optuna-dashboard: pip install 'precsearch[dashboard]' "
                        "(or pip install optuna-dashboard)", field="--optuna")
    from optuna_dashboard import run_server

    print(f"optuna-dashboard for study '{ws.study_name}' at http://{host}:{port} (Ctrl-C to stop)")
    try:
        run_server(ws.storage_url, host=host, port=port)
    except KeyboardInterrupt:
        pass
    return 0


def _open_study(output_dir: Path):
    import optuna

    from precsearch.runtime.stores import open_storage
    from precsearch.runtime.workspace import Workspace

    ws = Workspace.load(_study_dir(output_dir))
    try:
        return optuna.load_study(study_name=ws.study_name, storage=open_storage(ws.storage_url)), ws
    except KeyError:
        from precsearch.redact import redact_url

        raise UserError(f"study '{ws.study_name}' not found in {redact_url(ws.storage_url)}",
                        field="study.name") from None


def _study_dir(output_dir: Path | None) -> Path:
    """The study's directory (:func:`~precsearch.runtime.workspace.study_dir`); says which one when it was found."""
    from precsearch.runtime.workspace import study_dir

    found = study_dir(output_dir)
    if output_dir is None and found != Path("."):
        print(f"study directory: {found} (the one under precsearch-runs/)", file=sys.stderr)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="precsearch", description="Search per-layer FP8 precision policies.")
    parser.add_argument("--version", action="version", version=f"precsearch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    out_help = "the study's output directory (default for run: precsearch-runs/<study name>)"
    found_help = ("the study's output directory (default: this directory if it holds a study, else the one "
                  "study under precsearch-runs/)")

    p = sub.add_parser("run", help="run or resume the study a space file describes")
    p.add_argument("space", type=Path, help="the search space YAML file")
    p.add_argument("--n-trials", type=int, help="total trials to finish (default: study.n_trials)")
    p.add_argument("--output-dir", type=Path, help=out_help)
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run trials in N worker processes at once (CPU; default 1)")
    p.add_argument("--gpus", metavar="LIST",
                   help="one worker per GPU (per probe.nproc GPUs): 'all' or indices such as 0,1,2,3")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("worker", help="join a study from this process or machine (the study's storage "
                                      "must be reachable: PostgreSQL for several machines)")
    p.add_argument("--study", required=True, help="the study name")
    p.add_argument("--storage", help="Optuna storage URL, e.g. postgresql://user@host/db "
                                     "(default: $PRECSEARCH_STORAGE; keeps the password out of ps)")
    p.add_argument("--tracking-uri", help="the study's MLflow tracking server, e.g. http://host:5000 "
                                          "(default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--output-dir", type=Path, help="local files: references, logs "
                                                   "(default: precsearch-runs/<study>)")
    p.add_argument("--n-trials", type=int, help="stop when the study has this many finished trials "
                                                "(default: the space's study.n_trials)")
    p.add_argument("--name", default="", help="a label for this worker's messages")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("validate", help="check a space file without running anything")
    p.add_argument("space", type=Path)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("front", help="print the Pareto front of a study")
    p.add_argument("--output-dir", type=Path, help=found_help)
    p.add_argument("--all", action="store_true", help="every finished trial, not only the front")
    p.set_defaults(func=cmd_front)

    p = sub.add_parser("export", help="write a trial's policy, or the settings of a training framework")
    p.add_argument("--output-dir", type=Path, help=found_help)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial", type=int, help="the trial number")
    which.add_argument("--pick", choices=tuple(PICKS),
                       help="choose the trial: most memory saved, highest tokens/s on the Pareto front, or "
                            "lowest instability (among feasible trials)")
    p.add_argument("--max-instability", type=float, metavar="X",
                   help="with --pick: only trials whose instability is at most X, in the study's one unit, the "
                        "one 'precsearch front' names above its table and its limit is in: BF16 seed spreads "
                        "(stability_unit noise, e.g. 1.0), the reading's measure (reading damage, e.g. 0.005 "
                        "update_norm), else a fraction of the BF16 loss (e.g. 0.005 for 0.5%%)")
    p.add_argument("--margin", type=float, metavar="F",
                   help="with --pick: prefer trials whose instability stays at most (1 - F) x the study's "
                        f"stability limit, and say which trial that passed over (default {DEFAULT_MARGIN:g}; 0 "
                        "keeps no margin)")
    p.add_argument("--format", choices=tuple(FORMATS), default=next(iter(FORMATS)),
                   help="policy.yaml (default), Megatron-LM flags + precision config, a torchtitan TOML "
                        "section, or an Accelerate snippet")
    p.add_argument("--n-layers", type=int, metavar="N",
                   help="blocks of the model the files are for (default: the study's target model)")
    p.add_argument("--pipeline-parallel", type=int, default=1, metavar="N",
                   help="megatron: the run's --pipeline-model-parallel-size, times its virtual stages per rank "
                        "with an interleaved schedule (default 1); per-block precision is then written in the "
                        "block numbers each pipeline chunk sees")
    p.add_argument("-o", "--output",  # a str: Path would drop the trailing '/' that says "a directory"
                   help="file to write, or a directory (formats that write several files need one); "
                        "default: standard output")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("ui", help="open the MLflow UI on the study's store")
    p.add_argument("--output-dir", type=Path, help=found_help)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--optuna", action="store_true",
                   help="optuna-dashboard on the study's Optuna storage instead (needs precsearch[dashboard])")
    p.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dump_stacks_on_signal()  # `kill -USR1 PID`: where a run that looks stuck is waiting
    warnings.filterwarnings("ignore", category=UserWarning, module="optuna")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's own HTTP retries would wait minutes per call; precsearch retries with its own budget
    # (study.store_retry_s) around each call instead.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # one line per run otherwise
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # precsearch drives heartbeats itself around ask/tell (precsearch.runtime.study._run_trial)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    try:
        return args.func(args)
    except (UserError, PrecisionConflict) as exc:  # a hand-written policy file may split a fused unit
        print(f"precsearch: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
