"""A space may offer only what the long paired runs passed: refused states, unsoaked states and recipes.

A 40-step probe cannot see what fails after a thousand steps. ``benchmarks/bench_soak.py`` trains each
optimizer-state combination the memory knobs accept, and each GEMM recipe family, for 2,000 annealed steps,
8 seeds, each paired with the standard set-up (FP32 master weights and moments) on the same init and data
(``docs/results/soak.md``). ``validate`` reads it three ways:

* **refused**: what went non-finite, diverged or was decided damaging, with the soak's figure: the optimizer
  states :data:`REFUSED` lists and the recipes with a :attr:`~precsearch.recipes.Recipe.soak_refused`; no
  opt-in offers them;
* **passed**: an optimizer state in :data:`precsearch.config.soak_states.PASSED` (what "the same state" means
  is written there), the baseline's own state, and a recipe with a
  :attr:`~precsearch.recipes.Recipe.soak` finding are accepted;
* **unsoaked**: anything else is refused, naming the field, its value, the state and the passed states
  nearest it, unless the space sets ``search.allow_unsoaked: true``; then ``validate`` and ``run`` warn once
  per unsoaked state or recipe (:func:`soak_warnings`).

Every problem of the space is reported at once, one line each.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from precsearch.config.soak_states import NOT_RUN, PASSED, OptimizerState, differing_parts, nearest_passed, state_of
from precsearch.config.space import Space
from precsearch.errors import UserError, UserErrors
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Precision
from precsearch.recipes import low_recipes, recipe_for
from precsearch.storage import FP32


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
            "+162% ± 17% after 2,000 annealed steps with a remainders master (4 of 4 seeds; H100, 2026-12-06, "
            "bench_soak row std_rem_fp8) and +130% ± 18% with an FP32 master (8 of 8 seeds; H200, 2026-12-06, "
            "std_fp32_fp8)",
            "valid: fp8_block (a scale per 128 elements, the second moment as its root), bf16 or fp32"),
    Refused(("master_weights",), (False,), _drops_the_master,
            "BF16 weights without an FP32 master, against a baseline that keeps one, were decided damaging in "
            "the soak: paired held-out loss +6.4% ± 0.9% after 2,000 annealed steps with FP32 moments (8 seeds; "
            "H100, 2026-12-06, bench_soak row std_none_fp32) and +6.6% ± 1.1% with fp8_block moments (8 seeds; "
            "H200, 2026-12-06, std_none_fp8block)",
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


@dataclass(frozen=True)
class Unsoaked:
    """One optimizer state or GEMM recipe a space offers that no long run has passed.

    Attributes:
        field: The space file's field that offers it (``search.memory.moment_dtype``).
        value: That field's value.
        what: What it offers (the state, or the recipe's GEMMs).
        why: Why no finding (the row not run, or no row).
        nearby: The passed states or recipes nearest it, with their figures.
    """

    field: str
    value: object
    what: str
    why: str
    nearby: str

    def refusal(self) -> UserError:
        """The refusal ``validate`` gives without ``search.allow_unsoaked``."""
        return UserError(f"{self.value!r} offers {self.what}, which no long run has passed ({self.why}; 2,000 "
                         f"annealed steps, docs/results/soak.md); passed nearby: {self.nearby}; valid: a choice that "
                         "passed, or search.allow_unsoaked: true to offer it anyway", field=self.field)

    def warning(self) -> str:
        """The line ``validate`` and ``run`` print with ``search.allow_unsoaked``."""
        return (f"{self.field}: {self.value!r} offers {self.what}, which no long run has passed ({self.why}); "
                "offered because search.allow_unsoaked is true")


def check_soak(space: Space) -> None:
    """Refuse a space that offers a state :data:`REFUSED` lists, or (without ``search.allow_unsoaked``) an
    optimizer state or GEMM recipe no long run has passed, naming each field, its value and the soak's figures.

    Raises:
        UserError: One problem; :class:`~precsearch.errors.UserErrors` for several, one line each.
    """
    problems = _refusals(space)
    if not space.search.allow_unsoaked:
        problems += [u.refusal() for u in unsoaked(space)]
    if problems:
        raise problems[0] if len(problems) == 1 else UserErrors(problems)


def soak_warnings(space: Space) -> list[str]:
    """One line per unsoaked state or recipe a space offers with ``search.allow_unsoaked`` ([] without it)."""
    return [u.warning() for u in unsoaked(space)] if space.search.allow_unsoaked else []


def _refusals(space: Space) -> list[UserError]:
    """One refusal per (field, value) that offers a state :data:`REFUSED` lists, then one per GEMM recipe whose
    long run failed (:attr:`~precsearch.recipes.Recipe.soak_refused`)."""
    return _refused_states(space) + _refused_recipes(space)


def _refused_recipes(space: Space) -> list[UserError]:
    found = []
    for precision, where in _precision_fields(space).items():
        recipe = recipe_for(precision)
        if recipe.soak_refused:
            found.append(UserError(
                f"{precision.value!r} offers {_gemms(recipe, where)}, which the long runs refused: "
                f"{recipe.soak_refused}; valid: a recipe that passed ({_passed_recipes()}); a policy file you "
                "write still runs it (docs/results/soak.md)", field=where[0]))
    return found


def _passed_recipes() -> str:
    return ", ".join(r.name for r in low_recipes() if r.soak is not None)


def _gemms(recipe, where: list[str]) -> str:
    """What offering ``recipe`` offers, and the other fields that offer it (``NVFP4 GEMMs (also offered by
    search.groups[1].precision)``); ``where`` is its fields in the file's order, the first one named."""
    also = f" (also offered by {', '.join(where[1:])})" if where[1:] else ""
    return f"{recipe.spec.label} GEMMs{also}"


def _refused_states(space: Space) -> list[UserError]:
    found: dict[tuple[str, object, int], UserError] = {}
    for knobs, chosen in _offered_knobs(space):
        for index, rule in enumerate(REFUSED):
            if rule.offered(knobs, space):
                field = next((f for f in rule.fields if chosen[f] in rule.values), rule.fields[0])
                found.setdefault((field, chosen[field], index), UserError(
                    f"{chosen[field]!r} offers a state the long runs refused: {rule.finding}; {rule.advice}",
                    field=f"search.memory.{field}"))
    return list(found.values())


def unsoaked(space: Space) -> list[Unsoaked]:
    """Every optimizer state, then every GEMM recipe, that ``space`` offers and no long run has passed."""
    return _unsoaked_states(space) + _unsoaked_recipes(space)


def _unsoaked_states(space: Space) -> list[Unsoaked]:
    param_dtype = space.probe.param_dtype
    baseline = state_of(space.baseline_knobs(), param_dtype)
    found: dict[OptimizerState, Unsoaked] = {}
    for knobs, chosen in _offered_knobs(space):
        state = state_of(knobs, param_dtype)
        if state in PASSED or state == baseline or state in found or any(r.offered(knobs, space) for r in REFUSED):
            continue
        near = nearest_passed(state)
        field = _blamed(space, knobs, chosen, {p for s in near for p in differing_parts(state, s)})
        row = NOT_RUN.get(state)
        found[state] = Unsoaked(
            f"search.memory.{field}", chosen[field],
            f"{state} (with {', '.join(knobs.optimizer_knobs.changed()) or 'the default knobs'})",
            f"bench_soak row {row} has not run" if row else "no bench_soak row runs it",
            "; ".join(f"{s} ({PASSED[s][0].cited()})" for s in near))
    return list(found.values())


def _blamed(space: Space, knobs: MemoryKnobs, chosen: dict[str, object], parts: set[str]) -> str:
    """The ``search.memory`` field to name for a state that differs from the nearest passed ones in ``parts``:
    one that sets such a part, the space's searched fields first, then those it writes."""
    own = [f for f in ("exp_avg_dtype", "exp_avg_sq_dtype") if chosen[f] is not None]
    sources = {
        "master": _master_fields(knobs, space.probe.param_dtype),
        "moments": own + (["moment_dtype"] if len(own) < 2 else []),
        "fp8_weights": ["fp8_weights"],
    }
    candidates = [f for part in sources if part in parts for f in sources[part]] or ["moment_dtype"]
    section = space.search.memory
    searched = [f for f in candidates if not getattr(section, f).is_fixed]
    written = [f for f in candidates if f in section.model_fields_set]
    return (searched or written or candidates)[0]


def _master_fields(knobs: MemoryKnobs, param_dtype: str) -> list[str]:
    """The field that sets the master kind (none with FP32 parameters, their own master)."""
    if knobs.fp8_weights:
        return ["fp8_weights"]
    if param_dtype == FP32:
        return []
    return ["master_dtype"] if knobs.master_weights else ["master_weights"]


def _unsoaked_recipes(space: Space) -> list[Unsoaked]:
    passed = "; ".join(f"{r.name} ({r.soak.cited()})" for r in low_recipes() if r.soak is not None)
    found = []
    for precision, where in _precision_fields(space).items():
        recipe = recipe_for(precision)
        if recipe.soak is not None or recipe.soak_refused:
            continue
        found.append(Unsoaked(where[0], precision.value, _gemms(recipe, where), "no bench_soak row runs it", passed))
    return found


def _precision_fields(space: Space) -> dict[Precision, list[str]]:
    """Each precision a layer of some trial can run -> the fields that offer it, in the file's order."""
    search = space.search
    knobs = [("search.default_precision", search.default_precision),
             *((f"search.groups[{i}].precision", g.precision) for i, g in enumerate(search.groups)),
             *((f"search.units[{i}].precision", u.precision) for i, u in enumerate(search.units))]
    offered: dict[Precision, list[str]] = {}
    for field, knob in knobs:
        for precision in knob.options():
            offered.setdefault(precision, []).append(field)
    return offered
