"""The optimizer states the long paired runs passed, and what "the same state" means.

``benchmarks/bench_soak.py`` runs each row of ``COMBOS`` for 2,000 annealed steps, paired with the standard
set-up (``docs/results/soak.md``). :data:`PASSED` lists the optimizer states of the rows that passed, each with
every row that ran it; :data:`NOT_RUN` the rows of ``COMBOS`` not run yet. ``validate`` accepts a state in
:data:`PASSED`, refuses the ones :data:`precsearch.config.soak_checks.REFUSED` lists, and refuses any other
unless the space sets ``search.allow_unsoaked`` (:mod:`precsearch.config.soak_checks`).

**The same state.** A state is what the optimizer keeps and how it updates, never how the layers compute:
:class:`OptimizerState` (master kind, first and second moment storage, FP8-only weights), as
:func:`state_of` reads it from the memory knobs and the probe's parameter dtype:

* the GEMM recipe is no part of it: a state passed when some row with that state passed, whatever its GEMMs
  (``remainders`` with ``fp8_block`` moments ran under BF16, delayed and block-scaled GEMMs);
* the moments are the pair :meth:`~precsearch.policy.MemoryKnobs.moment_dtypes` gives: ``moment_dtype:
  bf16`` and ``exp_avg_dtype: bf16`` with ``exp_avg_sq_dtype: bf16`` are one state; ``param`` is the
  parameters' dtype; a mixed pair is its own state (no row has run one);
* the master is :attr:`~precsearch.policy.MemoryKnobs.master` (``none`` without master weights,
  ``master_dtype`` with them, FP32 under ``fp8_weights``), except with FP32 parameters, which are their own
  FP32 master (as :meth:`~precsearch.policy.MemoryKnobs.resolved` says), so there the master is ``fp32``
  whatever the knobs (``master_dtype`` other than fp32 on FP32 parameters is refused by preflight);
* ``remainders`` and ``fp32`` masters keep the same FP32 values, but are kept apart here: a state passed only
  if a row ran it (``std_rem_bf16`` and ``std_fp32_bf16`` both ran and passed);
* ``fp8_attention`` is not optimizer state (no row varies it).

The state the space's own baseline trains in (``objectives.baseline_memory``) is accepted too: a trial in it
trains as the user's run does.
"""

from __future__ import annotations

from dataclasses import dataclass

from precsearch.policy.rules import MemoryKnobs
from precsearch.recipes import all_recipes
from precsearch.soak import SoakFinding
from precsearch.storage import BF16, BLOCK_FP8, FP32

#: Master kinds beyond :data:`~precsearch.storage.MASTER_DTYPES`: none (BF16 weights updated in place).
NO_MASTER = "none"
REMAINDERS = "remainders"
FP16 = "fp16"
#: The card and day of the rows the second soak call ran (``benchmarks/results/2026-12-07_bench_soak.json``).
H200, DATE = "H200 141 GB", "2026-12-06"


@dataclass(frozen=True)
class OptimizerState:
    """What the optimizer keeps: the master kind and each moment's storage, and whether weights are FP8 only.

    Attributes:
        master: ``fp32``, ``remainders``, ``fp16`` or ``none``.
        exp_avg: The first moment's storage (``fp32``, ``bf16``, ``fp8`` or ``fp8_block``).
        exp_avg_sq: The second moment's.
        fp8_weights: FP8 layers keep their weights in FP8 only (``te.quantized_model_init``).
    """

    master: str
    exp_avg: str
    exp_avg_sq: str
    fp8_weights: bool = False

    def parts(self) -> dict[str, object]:
        """The parts two states are compared by (the moments as one pair)."""
        return {"master": self.master, "moments": (self.exp_avg, self.exp_avg_sq), "fp8_weights": self.fp8_weights}

    def __str__(self) -> str:
        weights = ", FP8 weights" if self.fp8_weights else ""
        return f"master {self.master}, moments {self.exp_avg}/{self.exp_avg_sq}{weights}"


def state_of(knobs: MemoryKnobs, param_dtype: str) -> OptimizerState:
    """The optimizer state a trial with ``knobs`` trains in, with ``param_dtype`` parameters."""
    first, second = knobs.moment_dtypes(param_dtype)
    master = FP32 if param_dtype == FP32 and not knobs.fp8_weights else knobs.master
    return OptimizerState(master, first, second, knobs.fp8_weights)


#: The standard set-up (FP32 master weights and moments): the pair of every row, and the state each recipe's
#: own row ran in (:attr:`precsearch.recipes.Recipe.soak`).
STANDARD = OptimizerState(FP32, FP32, FP32)

PASSED: dict[OptimizerState, tuple[SoakFinding, ...]] = {
    STANDARD: tuple(r.soak for r in all_recipes() if r.soak is not None),
    OptimizerState(FP32, BLOCK_FP8, BLOCK_FP8): (
        SoakFinding("std_fp32_fp8block", -1.70, 1.09, 8),
        SoakFinding("fp8_current_fp32_fp8block", -2.42, 1.27, 8)),
    OptimizerState(REMAINDERS, BLOCK_FP8, BLOCK_FP8): (
        SoakFinding("std_rem_fp8block", -3.28, 1.44, 8),
        SoakFinding("fp8_delayed_rem_fp8block", -0.47, 1.24, 8),
        SoakFinding("fp8_block_rem_fp8block", -1.99, 1.33, 8)),
    OptimizerState(REMAINDERS, BF16, BF16): (
        SoakFinding("std_rem_bf16", 0.14, 0.45, 8),
        SoakFinding("fp8_current_rem_bf16", -2.10, 1.33, 8)),
    OptimizerState(FP32, BF16, BF16): (SoakFinding("std_fp32_bf16", 0.27, 0.32, 8, card=H200, date=DATE),),
    OptimizerState(REMAINDERS, FP32, FP32): (SoakFinding("std_rem_fp32", 0.66, 0.71, 8, card=H200, date=DATE),),
    # undecided at both levels (+0.97% +- 0.95%): not decided damaging and never non-finite, so it passes
    OptimizerState(FP16, FP32, FP32): (SoakFinding("std_fp16_fp32", 0.97, 0.95, 8, card=H200, date=DATE),),
    # FP8-only weights (TE's FusedAdam FP8-parameter path: FP32 master and moments) under FP8 delayed GEMMs, run
    # again once build_optimizer refreshed their transposes after each step (+39.9% +- 1.7% before: a stale one)
    OptimizerState(FP32, FP32, FP32, fp8_weights=True): (
        SoakFinding("std_fp32_fp32_fp8w", -1.36, 1.50, 8, date="2026-12-07"),),
    # ---- add a row that passed here, with its figure from docs/results/soak.md, and remove it from NOT_RUN
}
"""State -> the rows that ran it and passed (2026-12-06; H100 80 GB unless the finding names the H200; the
BF16-GEMM row first)."""

NOT_RUN: dict[OptimizerState, str] = {}
"""State -> its row in ``bench_soak.COMBOS``, for the rows not run yet (refused states left out): none since the
H200 call of 2026-12-06."""


def nearest_passed(state: OptimizerState) -> list[OptimizerState]:
    """The passed states that differ from ``state`` in the fewest parts (:meth:`OptimizerState.parts`)."""
    def distance(other: OptimizerState) -> int:
        return sum(a != b for a, b in zip(state.parts().values(), other.parts().values()))

    fewest = min(distance(s) for s in PASSED)
    return [s for s in PASSED if distance(s) == fewest]


def differing_parts(state: OptimizerState, other: OptimizerState) -> list[str]:
    """The parts (``master``, ``moments``, ``fp8_weights``) in which two states differ."""
    mine, theirs = state.parts(), other.parts()
    return [part for part in mine if mine[part] != theirs[part]]
