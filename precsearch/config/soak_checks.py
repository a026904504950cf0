"""Optimizer states the long paired runs decided against: a space may not offer them.

A 40-step probe cannot see what fails after a thousand steps. ``benchmarks/bench_soak.py`` trains each
optimizer-state combination the memory knobs accept for 2,000 annealed steps, 8 seeds, each paired with the
standard set-up (FP32 master weights and moments) on the same init and data (``docs/results/soak.md``). What
went non-finite, diverged or was decided damaging there is refused here, with the soak's figure, so no study
offers it. What passed (``fp8_block`` moments with any master after the tiny-moment fix, BF16 moments,
remainders) is not listed: every combination not refused here either passed or was not run, and
``docs/results/soak.md`` says which.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.policy.rules import MemoryKnobs


@dataclass(frozen=True)
class Refused:
    """One training state the soak decided against.

    Attributes:
        fields: The ``search.memory`` fields that can choose it.
        values: The values of those fields that do (the first field holding one is named).
        offered: Whether a trial with these knobs, in this space, trains in that state.
        finding: What the soak measured, with its card, date and row.
        advice: What to offer instead.
    """

    fields: tuple[str, ...]
    values: tuple[object, ...]
    offered: Callable[[MemoryKnobs, Space], bool]
    finding: str
    advice: str


def _per_tensor_fp8(knobs: MemoryKnobs, space: Space) -> bool:
    return "fp8" in knobs.moment_dtypes(space.probe.param_dtype)


def _drops_the_master(knobs: MemoryKnobs, space: Space) -> bool:
    """BF16 weights updated in place while the user's baseline keeps an FP32 master of them."""
    return (space.probe.param_dtype == "bf16" and not knobs.uses_master_weights
            and space.baseline_knobs().uses_master_weights)


REFUSED: tuple[Refused, ...] = (
    Refused(("moment_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"), ("fp8",), _per_tensor_fp8,
            "per-tensor FP8 moments (one scale per tensor, TE's) diverged in the soak: paired held-out loss "
            "+162% ± 17% after 2,000 annealed steps (4 of 4 seeds; H100, 2026-12-06, bench_soak row std_rem_fp8)",
            "valid: fp8_block (a scale per 128 elements, the second moment as its root), bf16 or fp32"),
    Refused(("master_weights",), (False,), _drops_the_master,
            "BF16 weights without an FP32 master, against a baseline that keeps one, were decided damaging in "
            "the soak: paired held-out loss +6.4% ± 0.9% after 2,000 annealed steps (8 seeds; H100, "
            "2026-12-06, bench_soak row std_none_fp32)",
            "valid: master_weights: true (master_dtype: remainders keeps the same FP32 values in 2 bytes), or a "
            "baseline without master weights (objectives.baseline_memory) if your training has none"),
)


def _offered_knobs(space: Space) -> Iterator[tuple[MemoryKnobs, dict[str, object]]]:
    """Every memory-knob combination a trial of ``space`` can take, with the field values that make it."""
    section = space.search.memory
    names = [f.name for f in fields(MemoryKnobs)]
    for values in itertools.product(*(getattr(section, n).options() for n in names)):
        chosen = dict(zip(names, values))
        try:
            yield MemoryKnobs(**chosen), chosen
        except ValueError:  # an impossible combination: the value checks name it
            continue


def check_soak(space: Space) -> None:
    """Refuse a space whose memory knobs offer a state :data:`REFUSED` lists, naming the field, its value and
    the soak's figure."""
    for knobs, chosen in _offered_knobs(space):
        for rule in REFUSED:
            if rule.offered(knobs, space):
                field = next((f for f in rule.fields if chosen[f] in rule.values), rule.fields[0])
                raise UserError(f"{chosen[field]!r} offers a state the long runs refused: {rule.finding}; "
                                f"{rule.advice}", field=f"search.memory.{field}")
