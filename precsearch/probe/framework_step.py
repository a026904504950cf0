"""A framework's step time for a trial, from the probe's: the probe's step with its optimizer step swapped for the
framework's, measured per optimizer state, clipping and card.

Why: Megatron-Core's standard optimizer (FP32 main gradients, FP32 main parameters and moments, copied back to
BF16) steps far slower than the probe's, while its precision-aware one (TE ``FusedAdam`` on the BF16 weights) is
close to it. On one H100 at the 8B width, 4 blocks (``benchmarks/results/2026-12-07_h100_targets_megatron.json``),
Megatron ran a trial with every GEMM in BF16 1.10x faster than its standard BF16 run, all of it in the optimizer
step (28.2 ms against 39.7; forward and backward alike), where the probe, whose own optimizer gains nothing from
those knobs, said 0.99x. The rest of a step scales alike between the two: Megatron's forward and backward were
4-6% shorter than the probe's in all three runs.

So a framework's step is predicted as

    probe's step - probe's optimizer step (ProbeResult.optimizer_step_s) + framework's optimizer step

where the framework's optimizer step is :attr:`OptimizerRate.s_per_param` times the probe model's parameters
(the step is memory-bound: it reads and writes each parameter's states once). The rates are measurements, one row
per (framework, optimizer state, clipping, card); a trial whose row is missing gets no prediction (the caller
keeps the probe's speed-up and says why). The rows and what they were measured on are in :data:`OPTIMIZER_RATES`;
docs/frameworks.md, "The front's speed-up for a framework target", gives what the rule has been checked against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from precsearch.policy.rules import MemoryKnobs

#: The card names the rates were measured on (``torch.cuda.get_device_name``), by the name a row gives.
CARDS = {"h100": ("NVIDIA H100 80GB HBM3",)}

#: Parameters of the model the rates were measured on: Llama-3-8B's width at 4 blocks (embedding and head untied).
_MEASURED_PARAMS = 1_923_125_248


@dataclass(frozen=True)
class OptimizerRate:
    """One measured optimizer step of a framework.

    Attributes:
        framework: The framework (a target name: ``megatron``).
        state: :func:`state_key` of the optimizer state the framework kept.
        clipped: Whether the step clipped the gradients (Megatron computes their norm only then).
        card: A key of :data:`CARDS`.
        s_per_param: Seconds of the optimizer step per parameter.
        source: The measurement: its file, rows and figures.
    """

    framework: str
    state: str
    clipped: bool
    card: str
    s_per_param: float
    source: str


def state_key(memory: MemoryKnobs, param_dtype: str = "bf16") -> str:
    """The optimizer state a rate is for: ``master=fp32 moments=fp32/fp32``."""
    first, second = memory.moment_dtypes(param_dtype)
    return f"master={memory.master} moments={first}/{second}"


_MEGATRON_RUNS = "benchmarks/results/2026-12-07_h100_targets_megatron.json (Megatron-Core 0.19.2, 4 blocks, seq 4096)"

#: Every measured rate. Megatron's step phase is CUDA events around ``optimizer.step()`` (main-gradient copies,
#: the norm and clipping, the update, the copy back), the median of the timed steps.
OPTIMIZER_RATES: tuple[OptimizerRate, ...] = (
    OptimizerRate("megatron", "master=fp32 moments=fp32/fp32", True, "h100", 39.73e-3 / _MEASURED_PARAMS,
                  f"{_MEGATRON_RUNS}: the standard BF16 run, 39.7 ms"),
    OptimizerRate("megatron", "master=remainders moments=bf16/bf16", True, "h100",
                  (28.24e-3 + 28.02e-3) / 2 / _MEASURED_PARAMS,
                  f"{_MEGATRON_RUNS}: trials 8 and 1 (precision-aware distributed optimizer), 28.2 and 28.0 ms"),
)


def card_key(card: str) -> str | None:
    """The :data:`CARDS` key of a device name, or None where no rate was measured on that card."""
    return next((key for key, names in CARDS.items() if card in names), None)


def optimizer_rate(framework: str, memory: MemoryKnobs, clipped: bool, card: str) -> OptimizerRate | None:
    """The measured rate of ``framework`` stepping ``memory``'s state on ``card`` (a device name), or None."""
    return rate_for(framework, state_key(memory), clipped, card)


def rate_for(framework: str, state: str, clipped: bool, card: str) -> OptimizerRate | None:
    """:func:`optimizer_rate` by the state's :func:`state_key` (what a bench row records)."""
    key = card_key(card)
    return next((r for r in OPTIMIZER_RATES if (r.framework, r.state, r.clipped, r.card) == (framework, state,
                                                                                            clipped, key)), None)


@dataclass(frozen=True)
class FrameworkSpeed:
    """A framework's predicted speed-up of a trial over its standard BF16 run, or why there is none.

    Attributes:
        framework: The framework.
        speedup: The predicted speed-up; NaN where ``why_not`` says why none was predicted.
        trial_step_s: The trial's predicted step in the framework (NaN without a prediction).
        baseline_step_s: The standard BF16 run's predicted step (NaN without a prediction).
        why_not: Why no prediction was made ("" where one was).
    """

    framework: str
    speedup: float = math.nan
    trial_step_s: float = math.nan
    baseline_step_s: float = math.nan
    why_not: str = ""


@dataclass(frozen=True)
class StepRun:
    """A probe run's times as :func:`framework_speed` reads them.

    Attributes:
        step_s: The probe's step (its tokens per step over its tokens/s).
        optimizer_step_s: The probe's optimizer step within it (``ProbeResult.optimizer_step_s``).
        memory: The optimizer state the framework keeps running it (as its export writes it).
        clipped: Whether the framework's run clips the gradients.
    """

    step_s: float
    optimizer_step_s: float
    memory: MemoryKnobs
    clipped: bool


def framework_speed(framework: str, trial: StepRun, baseline: StepRun, n_params: int, card: str) -> FrameworkSpeed:
    """The framework's speed-up of ``trial`` over ``baseline`` (its standard BF16 run), predicted from the probe's
    steps (see the module docstring); ``why_not`` says what is missing where nothing is predicted."""
    steps = []
    for what, run in (("the trial", trial), ("the BF16 baseline", baseline)):
        if not (math.isfinite(run.step_s) and run.step_s > 0 and math.isfinite(run.optimizer_step_s)):
            return FrameworkSpeed(framework, why_not=f"the probe timed no step or no optimizer step for {what}")
        rate = optimizer_rate(framework, run.memory, run.clipped, card)
        if rate is None:
            clipping = "with" if run.clipped else "without"
            return FrameworkSpeed(framework, why_not=(
                f"{framework}'s optimizer step for {what} ({state_key(run.memory)}, {clipping} clipping) is not "
                f"measured on {card or 'this device'}"))
        steps.append(run.step_s - run.optimizer_step_s + rate.s_per_param * n_params)
    return FrameworkSpeed(framework, steps[1] / steps[0], steps[0], steps[1])


__all__ = ["CARDS", "FrameworkSpeed", "OPTIMIZER_RATES", "OptimizerRate", "StepRun", "card_key", "framework_speed",
           "optimizer_rate", "rate_for", "state_key"]
