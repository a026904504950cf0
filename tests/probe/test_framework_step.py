"""A framework's step from the probe's: the probe's step with its optimizer step swapped for the framework's
(issue 52: Megatron ran a trial with every GEMM in BF16 1.10x faster than its standard BF16 run, all of it in its
optimizer step, where the probe said 0.99x). If these fail, the front's speed-up for a Megatron study is
computed from the wrong optimizer step, or a guess stands where no rate was measured."""

from __future__ import annotations

import math

import pytest

from precsearch.policy.rules import MemoryKnobs
from precsearch.probe.framework_step import (
    CARDS, OPTIMIZER_RATES, StepRun, card_key, framework_speed, optimizer_rate, state_key,
)
from precsearch.probe.memory.frameworks import MEGATRON_STANDARD

H100 = "NVIDIA H100 80GB HBM3"
AWARE = MemoryKnobs(master_weights=True, master_dtype="remainders", moment_dtype="bf16")
N_4_BLOCKS = 1_923_125_248  # the 8B width at 4 blocks, as ModelSection(preset="llama3-8b", probe_layers=4)


def test_every_rate_names_a_state_and_a_card_it_can_be_found_by():
    for rate in OPTIMIZER_RATES:
        assert rate.card in CARDS and rate.s_per_param > 0 and rate.source
        assert state_key(MEGATRON_STANDARD) == "master=fp32 moments=fp32/fp32"
    assert optimizer_rate("megatron", MEGATRON_STANDARD, True, H100).state == state_key(MEGATRON_STANDARD)
    assert optimizer_rate("megatron", AWARE, True, H100).state == "master=remainders moments=bf16/bf16"
    assert card_key(H100) == "h100" and card_key("NVIDIA H200") is None and card_key("") is None


def test_the_rule_gives_back_the_runs_its_rates_came_from():
    """Arithmetic, not validation: the probe's steps of the same study (call C, H100, 2026-12-07: BF16 reference
    101.8 ms, trial 8 102.7 ms, trial 1 96.4 ms) with the probe's optimizer steps of another H100 (21.75 ms for the
    BF16 references, 22.95 for the trials) give Megatron's measured 1.10x and 1.17x within 1.5%."""
    base = StepRun(0.1018, 0.02175, MEGATRON_STANDARD, True)
    for trial_step, measured in ((0.1027, 1.1016), (0.0964, 1.1676)):
        got = framework_speed("megatron", StepRun(trial_step, 0.02295, AWARE, True), base, N_4_BLOCKS, H100)
        assert got.why_not == "" and abs(got.speedup / measured - 1) < 0.015, got
        assert math.isclose(got.baseline_step_s / got.trial_step_s, got.speedup)


def test_a_slower_framework_optimizer_for_the_baseline_raises_the_trials_speed_up():
    """The probe's own optimizer gives these two the same step; Megatron's standard step is the slower one."""
    same = StepRun(0.100, 0.022, AWARE, True)
    got = framework_speed("megatron", same, StepRun(0.100, 0.022, MEGATRON_STANDARD, True), N_4_BLOCKS, H100)
    assert got.speedup > 1.05
    swapped = framework_speed("megatron", StepRun(0.100, 0.022, MEGATRON_STANDARD, True),
                              StepRun(0.100, 0.022, AWARE, True), N_4_BLOCKS, H100)
    assert swapped.speedup == pytest.approx(1 / got.speedup)


@pytest.mark.parametrize("trial, baseline, card, why", [
    (StepRun(0.1, 0.02, AWARE, True), StepRun(0.1, 0.02, MEGATRON_STANDARD, True), "NVIDIA H200",
     "is not measured on NVIDIA H200"),
    (StepRun(0.1, 0.02, AWARE, True), StepRun(0.1, 0.02, MEGATRON_STANDARD, True), "",
     "is not measured on this device"),
    (StepRun(0.1, 0.02, AWARE, False), StepRun(0.1, 0.02, MEGATRON_STANDARD, True), H100,
     "(master=remainders moments=bf16/bf16, without clipping) is not measured"),
    (StepRun(0.1, 0.02, MemoryKnobs(master_weights=True, moment_dtype="bf16"), True),
     StepRun(0.1, 0.02, MEGATRON_STANDARD, True), H100, "for the trial (master=fp32 moments=bf16/bf16"),
    (StepRun(0.1, math.nan, AWARE, True), StepRun(0.1, 0.02, MEGATRON_STANDARD, True), H100,
     "the probe timed no step or no optimizer step for the trial"),
    (StepRun(0.1, 0.02, AWARE, True), StepRun(math.nan, 0.02, MEGATRON_STANDARD, True), H100,
     "the probe timed no step or no optimizer step for the BF16 baseline"),
])
def test_nothing_is_predicted_without_a_measured_rate_and_it_says_why(trial, baseline, card, why):
    got = framework_speed("megatron", trial, baseline, N_4_BLOCKS, card)
    assert math.isnan(got.speedup) and why in got.why_not, got.why_not


def test_a_framework_without_rates_gets_none():
    got = framework_speed("torchtitan", StepRun(0.1, 0.02, MemoryKnobs(), True),
                          StepRun(0.1, 0.02, MemoryKnobs(), True), N_4_BLOCKS, H100)
    assert math.isnan(got.speedup) and "torchtitan's optimizer step" in got.why_not
