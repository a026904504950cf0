"""What the long paired runs measured: one :class:`SoakFinding` per row of the soak that passed.

``benchmarks/bench_soak.py`` trains each combination of a GEMM recipe and an optimizer state for 2,000 annealed
steps, each seed paired with the standard set-up (BF16 GEMMs, FP32 master weights and moments; the row
:data:`REFERENCE_ROW`) on the same initial weights and data (``docs/results/soak.md``). A finding is the figure
of one row that passed: held-out loss at the end against the pair's, non-finite runs, seeds, card and date.
The recipes carry theirs (:attr:`precsearch.recipes.Recipe.soak`), the optimizer states theirs
(:mod:`precsearch.config.soak_states`); ``validate`` reads both. Base layer: numbers and names only.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The row every other row is paired with (BF16 GEMMs, FP32 master weights and moments).
REFERENCE_ROW = "bf16_std"
#: The card and date of the measured table in ``docs/results/soak.md``.
H100_2026_12_06 = ("H100 80 GB", "2026-12-06")


@dataclass(frozen=True)
class SoakFinding:
    """One row of the soak that passed: no run non-finite, the paired gap not decided damaging.

    Attributes:
        row: Its name in ``bench_soak.COMBOS``.
        gap_pct: Mean paired held-out loss gap at the last step, in % of the pair's (0 for the reference).
        se_pct: Its standard error over the seeds, in %.
        seeds: Seeds run, each with its pair.
        non_finite: Runs that went non-finite (0 for a row that passed).
        card: The GPU it ran on.
        date: The day of the measurement.
        ran: The recipe settings it ran, where the recipe has some (``HYBRID, amax history 1024, max``).
        worst_pct: The worst seed's paired gap, in %, where one seed stands far out from the rest and the mean
            hides it (None where none does).
    """

    row: str
    gap_pct: float
    se_pct: float
    seeds: int
    non_finite: int = 0
    card: str = H100_2026_12_06[0]
    date: str = H100_2026_12_06[1]
    ran: str = ""
    worst_pct: float | None = None

    def __post_init__(self) -> None:
        if self.non_finite or self.seeds < 1 or self.se_pct < 0:
            raise ValueError(f"soak row {self.row}: a passed row has seeds, no non-finite run and an SE >= 0")

    @property
    def is_reference(self) -> bool:
        """Whether this is the pair itself (its gap is 0 by construction)."""
        return self.row == REFERENCE_ROW

    def figure(self) -> str:
        """The measurement in a few words (``+0.35% ± 1.05%, 8 seeds, 0 non-finite``; ``..., worst seed +16.4%``)."""
        gap = "the pair of every row" if self.is_reference else f"{self.gap_pct:+.2f}% ± {self.se_pct:.2f}%"
        worst = "" if self.worst_pct is None else f", worst seed {self.worst_pct:+.1f}%"
        return f"{gap}, {self.seeds} seeds, {self.non_finite} non-finite{worst}"

    def cited(self) -> str:
        """The figure with its row, card and date (``row fp8_current: +0.35% ± 1.05%, ...; H100 80 GB, ...``)."""
        return f"row {self.row}: {self.figure()}; {self.card}, {self.date}"

    def __str__(self) -> str:
        ran = f" ({self.ran})" if self.ran else ""
        return f"bench_soak row {self.row}{ran}: {self.figure()} at 2,000 annealed steps ({self.card}, {self.date})"
