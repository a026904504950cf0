"""Checks that need the whole space file or the model's layer names (never the machine).

Each returns nothing and raises :class:`UserError` naming the field.
"""

from __future__ import annotations

from dataclasses import fields

from precsearch.arch.config import unsplittable
from precsearch.config.group_checks import check_groups
from precsearch.config.inert import check_inert
from precsearch.config.soak_checks import check_soak
from precsearch.config.space import Space
from precsearch.config.unit_checks import check_units
from precsearch.config.value_checks import check_values
from precsearch.errors import UserError
from precsearch.policy.rules import MemoryKnobs
from precsearch.readings.registry import READINGS, get_reading

#: The memory knobs of ``search.memory``, each checked against the backend.
MEMORY_KNOB_NAMES = tuple(f.name for f in fields(MemoryKnobs))


def check_space(space: Space, *, file: str) -> None:
    """Every cross-field check of the file, in the order a user would fix them.

    None depends on this machine, so a space written for another machine can be checked here; what this
    machine must have (data files, checkpoint, backend and GPUs) is the CLI's preflight
    (:mod:`precsearch.runtime.preflight`).
    """
    checks = (check_values, _check_model, _check_warmup, check_groups, check_units, check_nproc, _check_fidelity,
              _check_damage, check_inert, check_soak)
    for check in checks:
        try:
            check(space)
        except UserError as exc:
            raise exc.located(file=file) from None


def _check_model(space: Space) -> None:
    try:
        space.model.probe()
    except ValueError as exc:
        raise UserError(str(exc), field="model") from None
    if space.probe.seq_len > space.model.probe().max_seq_len:
        raise UserError(
            f"seq_len {space.probe.seq_len} exceeds the model's max_seq_len {space.model.probe().max_seq_len}",
            field="probe.seq_len",
        )


def _check_warmup(space: Space) -> None:
    longest = max(v for v in space.search.warmup_steps.options())
    if longest >= space.probe.steps:
        raise UserError(
            f"FP8 warm-up of up to {longest} steps leaves no FP8 steps in a {space.probe.steps}-step probe; "
            f"valid: warm-up < probe.steps",
            field="search.warmup_steps",
        )
    if min(space.search.warmup_steps.options()) < 0:
        raise UserError("warm-up steps must be >= 0", field="search.warmup_steps")


def _check_damage(space: Space) -> None:
    """The fixed-state reading runs in a one-process probe's process; a sharded probe has no whole model to read.

    It reads a policy at the BF16 run's states with low precision on where the state's step is past the
    policy's warm-up: a searched warm-up no state falls inside reads the same for every choice (and memory and
    speed do not depend on it), so trials differing only in it score alike and crowd the front.
    """
    reading = get_reading(space.objectives.reading)
    if not reading.fixed_states:
        return
    if space.probe.nproc > 1:
        others = " or ".join(name for name, r in READINGS.items() if not r.fixed_states)
        raise UserError(f"reading '{reading.name}' reads one-process probes; probe.nproc is {space.probe.nproc}; "
                        f"valid: probe.nproc 1, or reading {others}", field="objectives.reading")
    warmup = space.search.warmup_steps
    if warmup.is_fixed:
        return
    steps = space.objectives.damage.state_steps(space.probe.steps)
    longest = max(warmup.options())
    if steps[0] >= longest:
        fractions = ", ".join(f"{f:g}" for f in space.objectives.damage.states)
        raise UserError(
            f"searched as {sorted(warmup.options())}, but objectives.damage.states [{fractions}] read the BF16 run "
            f"at steps {steps}, all past the longest warm-up ({longest}): every choice reads the same, and memory "
            f"and speed do not depend on it, so trials differing only in it score alike; fix "
            f"search.warmup_steps, or add a state inside the warm-up (a fraction below {longest / space.probe.steps:g} "
            "of probe.steps) to objectives.damage.states", field="search.warmup_steps")


def _check_fidelity(space: Space) -> None:
    fidelity = space.study.fidelity
    if fidelity is None:
        return
    if fidelity.rungs[0] != space.probe.steps:
        raise UserError(f"the first rung is the probe every policy gets, so it must equal probe.steps "
                        f"({space.probe.steps}); got {fidelity.rungs[0]}; valid: [{space.probe.steps}, ...]",
                        field="study.fidelity.rungs")
    if space.probe.nproc > 1:
        raise UserError(f"rungs continue a probe from its saved state, which a sharded probe (nproc "
                        f"{space.probe.nproc}) does not save yet; valid: nproc 1, or no study.fidelity",
                        field="study.fidelity")


def check_nproc(space: Space) -> None:
    """The ``probe.nproc`` and ``probe.tp`` checks of the file alone (for a probe launched on several processes)."""
    nproc, micro_batch, tp = space.probe.nproc, space.probe.micro_batch, space.probe.tp
    _check_tp(space)
    if nproc == 1:
        return
    groups = nproc // tp  # the data-parallel groups: each trains its own rows of the batch
    if micro_batch % groups:
        split = f"{groups} data-parallel groups (nproc {nproc} / tp {tp})" if tp > 1 else f"nproc {nproc}"
        raise UserError(
            f"{split} does not divide micro_batch {micro_batch}: a probe on several processes splits "
            f"its batch evenly over its data-parallel groups; valid: a micro_batch that {groups} divides",
            field="probe.nproc",
        )
    # FSDP2 with TE FusedAdam, FP32 masters or FP8 weights is not verified yet: refuse rather than guess
    knobs = {f"search.memory.{n}": getattr(space.search.memory, n) for n in MEMORY_KNOB_NAMES}
    for field, knob in knobs.items():
        if any(not MemoryKnobs(**{field.rsplit(".", 1)[1]: v}).is_default for v in knob.options()):
            raise UserError(f"memory knobs are not supported on a probe with nproc {nproc} (FSDP2, tensor "
                            "parallelism) yet; "
                            f"valid: the default only, or nproc 1", field=field)
    if not space.baseline_knobs().is_default:
        raise UserError(f"a non-default baseline memory is not supported with nproc {nproc} (FSDP2, tensor "
                        "parallelism) yet; "
                        f"valid: the defaults, or nproc 1", field="objectives.baseline_memory")


#: Backends that split a probe's blocks over ranks (:mod:`precsearch.probe.parallel.tensor_parallel`).
TP_BACKENDS = ("auto", "emulated", "te")


def _check_tp(space: Space) -> None:
    probe, tp = space.probe, space.probe.tp
    if tp == 1:
        return
    if probe.nproc % tp:
        raise UserError(f"tp {tp} does not divide nproc {probe.nproc}: each tensor-parallel group is tp of the "
                        f"probe's processes; valid: a divisor of nproc", field="probe.tp")
    if space.backend.value not in TP_BACKENDS:
        raise UserError(f"backend '{space.backend.value}' does not split blocks over ranks; valid with tp {tp}: "
                        f"{', '.join(TP_BACKENDS)}", field="backend")
    cfg = space.model.probe()
    if (name := unsplittable(cfg, tp)) is not None:
        raise UserError(f"tp {tp} does not divide the model's {name} ({getattr(cfg, name)}): each rank takes "
                        f"an equal share of the heads, FFN rows and vocabulary; valid: a divisor of "
                        f"{getattr(cfg, name)}", field="probe.tp")
    if probe.sequence_parallel and probe.seq_len % tp:
        raise UserError(f"tp {tp} does not divide seq_len {probe.seq_len}: sequence parallelism gives each rank an "
                        f"equal share of the tokens; valid: a seq_len that {tp} divides, or "
                        f"probe.sequence_parallel: false", field="probe.seq_len")
