"""The record of what passed the soak: each finding is a row of ``bench_soak.COMBOS`` in the state it is filed
under, and the knobs map to states as ``precsearch/config/soak_states.py`` says.

What would be wrong if these failed: ``validate`` would accept a state under a row that ran another one (a
figure borrowed from a different optimizer), keep refusing a row once it is added as passed, or call two
spellings of one state different (``moment_dtype`` against the per-moment fields; FP32 parameters against
their moot master).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from precsearch.config.soak_states import NOT_RUN, PASSED, STANDARD, OptimizerState, nearest_passed, state_of
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Precision
from precsearch.recipes import all_recipes, recipe_for
from precsearch.soak import REFERENCE_ROW

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_soak  # noqa: E402


def _row_state(row: str) -> OptimizerState:
    combo = bench_soak.COMBOS[row]
    return OptimizerState(combo.master, combo.exp_avg, combo.exp_avg_sq, combo.fp8_weights)


@pytest.mark.parametrize("state", list(PASSED), ids=str)
def test_each_passed_state_is_what_its_rows_ran(state):
    for finding in PASSED[state]:
        assert _row_state(finding.row) == state, finding.row
        assert finding.non_finite == 0 and finding.seeds >= 8 and finding.card and finding.date


def test_the_first_finding_of_a_state_ran_bf16_gemms():
    """Messages cite the first finding as the state's own figure: it must not mix in a GEMM recipe's effect (FP8-only
    weights aside: they exist only under FP8 GEMMs)."""
    assert all(bench_soak.COMBOS[f[0].row].recipe == "bf16" for state, f in PASSED.items() if not state.fp8_weights)


def test_each_recipe_finding_ran_its_gemms_with_the_standard_state():
    for recipe in all_recipes():
        if recipe.soak is not None:
            assert bench_soak.COMBOS[recipe.soak.row].recipe == recipe.name, recipe.name
            assert _row_state(recipe.soak.row) == STANDARD and recipe.soak in PASSED[STANDARD]


def test_the_rows_not_run_are_in_the_bench_and_not_passed():
    """A row moved to PASSED must leave NOT_RUN (else its refusal message says it has not run)."""
    assert not set(NOT_RUN) & set(PASSED)
    for state, row in NOT_RUN.items():
        assert _row_state(row) == state, row
    cited = {f.row for findings in PASSED.values() for f in findings} | set(NOT_RUN.values())
    refused = {"std_rem_fp8", "std_fp32_fp8", "std_none_fp32", "std_none_fp8block"}  # soak_checks.REFUSED's states
    # the emulated recipe rows a recipe cites once they pass, and their BF16 pair
    emulated = {name for name, c in bench_soak.COMBOS.items() if c.model == "emulated"}
    assert set(bench_soak.COMBOS) == cited | refused | emulated
    for name in emulated - cited - {bench_soak.EMULATED_BASE}:
        assert recipe_for(Precision(bench_soak.COMBOS[name].recipe)).soak is None or \
            bench_soak.COMBOS[name].recipe == "fp8_delayed", name  # not run: the recipe cites no row


@pytest.mark.parametrize("knobs, param_dtype, state", [
    (MemoryKnobs(master_weights=True, moment_dtype="bf16"), "bf16", OptimizerState("fp32", "bf16", "bf16")),
    (MemoryKnobs(master_weights=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"), "bf16",
     OptimizerState("fp32", "bf16", "bf16")),  # the per-moment fields spell the same state
    (MemoryKnobs(), "bf16", OptimizerState("none", "bf16", "bf16")),  # plain AdamW on BF16 parameters
    (MemoryKnobs(), "fp32", STANDARD),  # FP32 parameters are their own master
    (MemoryKnobs(master_weights=True), "fp32", STANDARD),
    (MemoryKnobs(master_weights=False, master_dtype="remainders", moment_dtype="bf16"), "bf16",
     OptimizerState("none", "bf16", "bf16")),  # master_dtype without master weights is moot
    (MemoryKnobs(master_weights=True, moment_dtype="bf16", fp8_weights=True, master_dtype="fp16"), "bf16",
     OptimizerState("fp32", "fp32", "fp32", fp8_weights=True)),  # TE's FP8-weight kernel: FP32 master, moments
    (MemoryKnobs(master_weights=True, moment_dtype="fp32", fp8_attention="dpa"), "bf16", STANDARD),
])
def test_the_knobs_map_to_the_state_the_optimizer_keeps(knobs, param_dtype, state):
    assert state_of(knobs, param_dtype) == state


def test_the_nearest_passed_states_differ_in_one_part():
    near = nearest_passed(OptimizerState("fp16", "bf16", "bf16"))
    assert set(near) == {OptimizerState("fp32", "bf16", "bf16"), OptimizerState("remainders", "bf16", "bf16"),
                         OptimizerState("fp16", "fp32", "fp32")}
    assert PASSED[STANDARD][0].row == REFERENCE_ROW
