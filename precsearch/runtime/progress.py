"""What the terminal shows while a study runs: one status line for the study, probe bars under it.

The status line says which trial runs, how many of ``n_trials`` finished, how many were
feasible, the front's size, the time so far and an estimate of the time left (:class:`Eta`).
Without progress bars (``--no-progress``, parallel workers) the same line is printed after each trial.
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


class Eta:
    """The time a study has left, from what each kind of probe cost so far in this run.

    A mean time per trial counts the BF16 references run before and between trials as trial time,
    and then multiplies them by every trial left: the quickstart's estimate read 49 min after trial
    0 (six reference probes ran first), then 1 h 17 min, for 27 min really left. Here each kind of
    probe (``trial``, ``reference``) has its own seconds per step; the time outside probes (asking,
    recording, start-up) is spread per trial. The estimate is the steps each kind has left times its
    rate, plus that per-trial time for the trials left, shared by the workers running beside this one
    (``parallel``: with two workers each used to show the whole study's time left, 2-4x the real one).

    The fixed-state reading's BF16 side (``bf16_side``: the BF16 run to its states and its gradients there,
    once per clipping value in a probe process) is a kind of its own, timed apart from the trial it came with:
    counted as trial time, the first trial of the 8B space (a 20 s BF16 side beside a 7 s probe on an H100)
    made the estimate 5x the time left (81 s shown, 15 s left, 2026-12-05).

    Args:
        trial_steps: Steps one trial's probes run (with the stress probe, if any).
        reference_steps: Steps of the BF16 reference probes not cached yet, for the whole study
            (an estimate: a clipping value the sampler never picks runs none).
        clock: Seconds, monotonic (a fake one in tests).
        bf16_side_steps: Steps of the BF16 runs of the reading's BF16 sides still to make (the same estimate);
            until one is timed, a step of them is taken to cost a reference step.
    """

    def __init__(self, trial_steps: int, reference_steps: int = 0, clock=time.monotonic, bf16_side_steps: int = 0):
        self.trial_steps, self.reference_steps, self.clock = trial_steps, reference_steps, clock
        self.bf16_side_steps = bf16_side_steps
        self.start = clock()
        self._seconds: dict[str, float] = {}
        self._steps: dict[str, int] = {}
        self.trials_done = 0
        self._waited = 0.0

    def probe_done(self, kind: str, steps: int, seconds: float) -> None:
        """A probe of ``kind`` ran ``steps`` steps in ``seconds``."""
        self._seconds[kind] = self._seconds.get(kind, 0.0) + seconds
        self._steps[kind] = self._steps.get(kind, 0) + steps
        if kind == "reference":
            self.reference_steps = max(0, self.reference_steps - steps)
        elif kind == "bf16_side":
            self.bf16_side_steps = max(0, self.bf16_side_steps - steps)

    def trial_done(self) -> None:
        self.trials_done += 1

    def probe_seconds(self) -> float:
        """Seconds spent in probes so far, every kind."""
        return sum(self._seconds.values())

    def waited(self, seconds: float) -> None:
        """Time spent waiting for another worker's references: not spread over this worker's trials (the
        references' own time is counted from the steps still uncached)."""
        self._waited += max(0.0, seconds)

    def left_s(self, trials_left: int, parallel: int = 1) -> float | None:
        """Seconds left for ``trials_left`` trials and the references still to run, with ``parallel`` workers
        on the study (at most one per trial left); None before any probe.

        The other ``parallel - 1`` workers are each inside a trial (counted in ``trials_left``), on average
        half done: without that, the estimate of a study's last trials was 1.5-3x the time left.
        """
        rates = {k: self._seconds[k] / self._steps[k] for k in self._steps if self._steps[k] > 0}
        if not rates:
            return None
        trial_rate = rates.get("trial", rates.get("reference"))
        reference_rate = rates.get("reference", trial_rate)
        outside = self.clock() - self.start - self.probe_seconds() - self._waited
        per_trial = outside / self.trials_done if self.trials_done else 0.0
        references = reference_rate * self.reference_steps if trials_left else 0.0
        references += rates.get("bf16_side", reference_rate) * self.bf16_side_steps if trials_left else 0.0
        shared = max(1, min(parallel, trials_left))
        units = trials_left - 0.5 * min(parallel - 1, trials_left)  # the trials running elsewhere, half done
        return (units * (trial_rate * self.trial_steps + per_trial) + references) / shared


def status_line(name: str, total: int, finished: int, feasible: int, front: int, elapsed_s: float,
                eta_s: float | None, running: int | None = None) -> str:
    """The study's one-line status; ``eta_s`` (:meth:`Eta.left_s`) None while nothing has been timed."""
    left = max(total - finished, 0)
    if left == 0:
        eta = "done"
    elif eta_s is not None:
        eta = f"ETA {duration(eta_s)}"
    else:
        eta = "ETA after the first probe"
    now = f"trial {running} running; " if running is not None and left else ""
    return (f"study {name}: {now}{finished} of {total} trials finished, {feasible} feasible, front {front} | "
            f"elapsed {duration(elapsed_s)}, {eta}")


class StudyStatus:
    """The status line of one process's run of a study (a tqdm line above the probe bars)."""

    def __init__(self, name: str, total: int, finished: int, bars: bool, eta: Eta | None = None):
        self.name, self.total, self.bars = name, total, bars
        self.start = time.monotonic()
        self.finished, self.feasible, self.front = finished, 0, 0
        self.running: int | None = None
        self.parallel = 1  # workers on the study, this one included (trial_done)
        self.eta = eta or Eta(trial_steps=0)
        self._line = tqdm(total=0, bar_format="{desc}", position=0, leave=True, disable=not bars)
        self.refresh()

    def line(self) -> str:
        return status_line(self.name, self.total, self.finished, self.feasible, self.front,
                           time.monotonic() - self.start,
                           self.eta.left_s(max(self.total - self.finished, 0), self.parallel),
                           self.running)

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

    def seconds_per_trial(self) -> float:
        """This process's wall time per trial so far (0 before its first)."""
        return (time.monotonic() - self.start) / self.eta.trials_done if self.eta.trials_done else 0.0

    def trial_done(self, finished: int, feasible: int, front: int, parallel: int = 1) -> str:
        """Record the study's counts after a trial (``parallel``: the workers now on the study, this one
        included); returns the new line."""
        self.finished, self.feasible, self.front, self.running = finished, feasible, front, None
        self.parallel = max(1, parallel)
        self.eta.trial_done()
        self.refresh()
        return self.line()

    def close(self) -> None:
        self._line.close()


def probe_bar(total: int, label: str, enabled: bool) -> tqdm:
    """A probe's step bar, on the line under the status line."""
    return tqdm(total=total, desc=label, unit="step", leave=False, position=1, disable=not enabled)


def compile_notice(backend: str, device: str) -> str | None:
    """Why a study's first probes take minutes where the probe compiles its blocks (backend torchao on a GPU: see
    ``TorchaoBackend.probe_compiles_blocks``); None elsewhere. Said once, at the start."""
    if backend != "torchao" or device == "cpu":
        return None
    return ("backend torchao on a GPU: each probe's blocks run compiled, as torchtitan runs them (eager torchao "
            "FP8 is slower than BF16). The first probe of each kind compiles them: at the 8B width the first trial "
            "waits on those compiles (one H100 had finished none after 200 s, before each block variant compiled "
            "once; not measured since)")


def reference_notice(clip_grad: float | None, seeds: int, steps: int, stress: bool) -> str:
    """Why BF16 probes run now (said once per set of references that is not cached yet)."""
    stressed = " and one at the stress learning rate" if stress else ""
    spread = "; their spread is the noise floor" if seeds > 1 else ""
    return (f"running the BF16 references for clip_grad={clip_grad}: {seeds} seed(s) x {steps} steps{stressed}. "
            f"Trials are scored against BF16 with the same gradient clipping, so each clip value needs its own "
            f"(cached in references/){spread}")
