"""What the terminal shows while a study runs: one status line for the study, probe bars under it.

The status line says which trial runs, how many of ``n_trials`` finished, how many were
feasible, the front's size, the time so far and an estimate of the time left (the mean time per
trial finished in this run, times the trials left; unknown until one finished). Without progress
bars (``--no-progress``, parallel workers) the same line is printed after each trial.
"""

from __future__ import annotations

import time

from tqdm import tqdm


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def status_line(name: str, total: int, finished: int, feasible: int, front: int, elapsed_s: float,
                finished_here: int, running: int | None = None) -> str:
    """The study's one-line status; ``finished_here`` (trials this run finished) drives the ETA."""
    left = max(total - finished, 0)
    if left == 0:
        eta = "done"
    elif finished_here > 0:
        eta = f"ETA {duration(elapsed_s / finished_here * left)}"
    else:
        eta = "ETA after the first trial"
    now = f"trial {running} running; " if running is not None and left else ""
    return (f"study {name}: {now}{finished} of {total} trials finished, {feasible} feasible, front {front} | "
            f"elapsed {duration(elapsed_s)}, {eta}")


class StudyStatus:
    """The status line of one process's run of a study (a tqdm line above the probe bars)."""

    def __init__(self, name: str, total: int, finished: int, bars: bool):
        self.name, self.total, self.bars = name, total, bars
        self.start, self.first_finished = time.monotonic(), finished
        self.finished, self.feasible, self.front = finished, 0, 0
        self.running: int | None = None
        self._line = tqdm(total=0, bar_format="{desc}", position=0, leave=True, disable=not bars)
        self.refresh()

    def line(self) -> str:
        return status_line(self.name, self.total, self.finished, self.feasible, self.front,
                           time.monotonic() - self.start, self.finished - self.first_finished, self.running)

    def refresh(self) -> None:
        self._line.set_description_str(self.line())
        self._shown = time.monotonic()

    def tick(self) -> None:
        """Keep the elapsed time current (called per probe step; redraws at most once a second)."""
        if time.monotonic() - self._shown >= 1.0:
            self.refresh()

    def trial_started(self, number: int) -> None:
        self.running = number
        self.refresh()

    def trial_done(self, finished: int, feasible: int, front: int) -> str:
        """Record the study's counts after a trial; returns the new line."""
        self.finished, self.feasible, self.front, self.running = finished, feasible, front, None
        self.refresh()
        return self.line()

    def close(self) -> None:
        self._line.close()


def probe_bar(total: int, label: str, enabled: bool) -> tqdm:
    """A probe's step bar, on the line under the status line."""
    return tqdm(total=total, desc=label, unit="step", leave=False, position=1, disable=not enabled)


def reference_notice(clip_grad: float | None, seeds: int, steps: int, stress: bool) -> str:
    """Why BF16 probes run now (said once per set of references that is not cached yet)."""
    stressed = " and one at the stress learning rate" if stress else ""
    spread = "; their spread is the noise floor" if seeds > 1 else ""
    return (f"running the BF16 references for clip_grad={clip_grad}: {seeds} seed(s) x {steps} steps{stressed}. "
            f"Trials are scored against BF16 with the same gradient clipping, so each clip value needs its own "
            f"(cached in references/){spread}")
