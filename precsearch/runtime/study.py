"""The Optuna driver: ask a policy, run its probe, score it, tell Optuna, log to MLflow.

It uses Optuna's ask-and-tell interface so that each trial is one plain loop
iteration: the probe, the scoring, the MLflow run and the Pareto update stay
readable in one place. The same loop (:func:`work`) runs in ``precsearch run``
(one worker, in-process), in each process of ``precsearch run --workers N`` /
``--gpus``, and in ``precsearch worker`` on other machines; several loops
share one study through its storage.

With ``study.fidelity``, the best policies of each rung are promoted to the
next, longer rung once it settles (:mod:`precsearch.search.promotion`); the
same loop runs those promoted trials after the study's ``n_trials``.

Nothing finished is lost: a study is resumable (the same command continues
it), a probe runs in a child process (:mod:`precsearch.runtime.executor`) so
its crash is a failed trial, and trials whose worker died are failed and
queued again (:mod:`precsearch.runtime.liveness`).
"""

from __future__ import annotations

from pathlib import Path

from precsearch.config.space import Space
from precsearch.runtime._optimize import recover_dead_trials, work
from precsearch.runtime.executor import ProbeExecutor
from precsearch.runtime.front_update import update_front
from precsearch.runtime.identity import check_directory
from precsearch.runtime.progress import compile_notice
from precsearch.runtime.study_log import say
from precsearch.runtime.session import StudyRun, open_run, start_guided
from precsearch.runtime.workspace import Workspace
from precsearch.utils import trace
from precsearch.search import proposals
from precsearch.search.front import trial_rows
from precsearch.search.scoring import objective_names
from precsearch.search.summary import finished_count


def run_study(space: Space, space_text: str, output_dir: Path | None = None, *, n_trials: int | None = None,
              progress: bool = True, workers: int = 1, gpus: list[int] | None = None,
              executor: ProbeExecutor | None = None) -> list[dict]:
    """Run (or resume) the study a space file describes; return the final trial rows.

    With ``workers`` > 1 or ``gpus``, trials run in that many worker processes (one per GPU slice).
    ``executor``: a probe process started already (one worker only), which the study uses and closes.
    """
    ws = Workspace.for_space(space, output_dir)
    ws.prepare()
    check_directory(ws)  # before anything is written: a refused run leaves the directory as it was
    ws.follow_move()
    target = n_trials or space.study.n_trials
    if workers > 1 or gpus:
        from precsearch.runtime.launcher import run_parallel

        return run_parallel(space, space_text, ws, target, workers=workers, gpus=gpus, progress=progress)
    with open_run(space, ws, progress, space_text=space_text, executor=executor) as ctx:
        proposals.set_batch_size(ctx.study, workers)
        recover_dead_trials(ctx)
        start_guided(ctx)
        say(ctx, f"study '{space.study.name}': {finished_count(ctx.study)} of {target} trials already "
                  f"finished; output in {ws.output_dir}")
        if (notice := compile_notice(space.backend.value, space.probe.device)) is not None:
            say(ctx, notice)
        try:
            work(ctx, target)
        except KeyboardInterrupt:
            ctx.tracker.close_stopped(lambda line: say(ctx, line))
            raise
        if ctx.stop.requested:  # the front's files are the resumed run's to update: Ctrl-C ends within a second
            ctx.tracker.close_stopped(lambda line: say(ctx, line))
            raise KeyboardInterrupt
        with trace.span("front update"):
            update_front(ctx)  # also after a resume with nothing left to run: a kill may have come before the update
        with trace.span("MLflow close"):
            ctx.tracker.close("FINISHED")
        return trial_rows(ctx.study, objective_names(space.objectives))


__all__ = ["StudyRun", "finished_count", "open_run", "recover_dead_trials", "run_study", "work"]
