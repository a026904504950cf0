"""Checks that need the whole space file, the model's layer names, or the machine.

Each returns nothing and raises :class:`UserError` naming the field.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from precsearch.arch.hf_checkpoint import check_checkpoint
from precsearch.backends import BackendUnavailable, UnsupportedRecipe, get_backend, resolve_device
from precsearch.backends.capability import gpu_capability
from precsearch.backends.te_knobs import fp8_attention_model_problem
from precsearch.backends.tp_group import unsplittable
from precsearch.config.group_checks import check_groups
from precsearch.config.space import FILE_SOURCES, DataSource, Space
from precsearch.config.unit_checks import check_units
from precsearch.config.values import check_values
from precsearch.errors import UserError
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import LayerRecipe

#: The memory knobs of ``search.memory``, each checked against the backend.
MEMORY_KNOB_NAMES = tuple(f.name for f in fields(MemoryKnobs))


def check_space(space: Space, *, file: str, environment: bool = True, gpu: bool = True) -> None:
    """Every cross-field check, in the order a user would fix them.

    With ``environment=False`` the checks that depend on this machine (data
    files present, backend and GPU able to run each precision) are skipped, so
    a space written for another machine can be checked here. With ``gpu=False``
    only the GPU's (:func:`gpu_checks_left`) are: a GPU space's checkpoint and
    data are checked on a CPU machine before the GPU is rented.
    """
    checks = [check_values, _check_model, _check_warmup, check_groups, check_units, _check_nproc, _check_fidelity]
    if environment:
        checks += [_check_checkpoint, _check_data] + ([_check_backend, _check_nproc_gpus] if gpu else [])
    for check in checks:
        try:
            check(space)
        except UserError as exc:
            raise exc.located(file=file) from None


def gpu_checks_left(space: Space) -> list[str]:
    """What :func:`check_space` cannot check for ``space`` on this machine because it has no CUDA GPU and the
    space asks for one (``probe.device: cuda`` or ``backend: te``); empty when it can check everything."""
    if torch.cuda.is_available() or (space.probe.device != "cuda" and space.backend.value != "te"):
        return []
    precisions = ", ".join(sorted(p.value for p in space.search.precisions()))
    left = [f"probe.device {space.probe.device}: a CUDA GPU is visible",
            f"backend {space.backend.value}: it runs {precisions} on that GPU (its compute capability)",
            "search.memory and objectives.baseline_memory: the backend supports the memory knobs"]
    if space.probe.nproc > 1:
        left.append(f"probe.nproc {space.probe.nproc}: that many GPUs are visible")
    return left


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


def _check_checkpoint(space: Space) -> None:
    """Every tensor the probe takes from ``model.init_from`` is there, with the config's shape."""
    start = space.model.start()
    if start is not None:
        check_checkpoint(start.path, start.layers)


def _check_data(space: Space) -> None:
    data = space.data
    # a megatron path is a prefix naming two files: its reader checks both (check_data)
    if data.source in FILE_SOURCES and data.source is not DataSource.MEGATRON and not data.path.exists():
        raise UserError(f"data file not found: {data.path}", field="data.path")
    if data.tokenizer is not None and not data.tokenizer.exists():
        raise UserError(f"tokenizer not found: {data.tokenizer}", field="data.tokenizer")
    byte_level = data.source == DataSource.STDLIB or (data.source == DataSource.TEXT and data.tokenizer is None)
    # (jsonl / hf_disk texts without a tokenizer are bytes too, unless they hold token ids: check_data reads them)
    if byte_level and space.model.probe().vocab_size < 256:
        raise UserError("byte-level data needs vocab_size >= 256", field="model.vocab_size")


def _check_backend(space: Space) -> None:
    try:
        device = resolve_device(space.probe.device)
    except BackendUnavailable as exc:
        raise UserError(str(exc), field="probe.device") from None
    try:
        backend = get_backend(space.backend.value, device, needs=space.search.precisions())
    except BackendUnavailable as exc:
        raise UserError(str(exc), field="backend") from None
    _check_memory_knobs(space, backend, device)
    fields = {f"search.groups[{i}].precision": g.precision for i, g in enumerate(space.search.groups)}
    fields |= {f"search.units[{i}].precision": u.precision for i, u in enumerate(space.search.units)}
    fields["search.default_precision"] = space.search.default_precision
    for field, knob in fields.items():
        try:
            backend.check_supported({f"{field}={p.value}": LayerRecipe(precision=p) for p in knob.options()}, device)
        except UnsupportedRecipe as exc:
            raise UserError(str(exc), field=field) from None


def _check_memory_knobs(space: Space, backend, device) -> None:
    problem = backend.memory_knob_problem(space.baseline_knobs(), device)
    if problem:
        raise UserError(f"{problem}; the default baseline is the standard BF16 set-up (FP32 master weights "
                        "and moments), which needs TE FusedAdam with BF16 parameters; valid here: "
                        "master_weights: false, moment_dtype: param (plain AdamW)", field="objectives.baseline_memory")
    mem = space.search.memory
    if space.probe.param_dtype == "fp32" and any(v != "fp32" for v in mem.master_dtype.options()):
        raise UserError("master_dtype fp16 or remainders change how FP32 master copies of BF16 parameters are "
                        "kept; with probe.param_dtype fp32 there are none; valid: fp32, or probe.param_dtype bf16",
                        field="search.memory.master_dtype")
    for name in MEMORY_KNOB_NAMES:
        for value in getattr(mem, name).options():
            knobs = MemoryKnobs(**{name: value})
            problem = backend.memory_knob_problem(knobs, device)
            if problem:
                raise UserError(problem, field=f"search.memory.{name}")  # the problem names the knob and value
    if any(v != "off" for v in mem.fp8_attention.options()):
        problem = fp8_attention_model_problem(space.model.probe().head_dim, gpu_capability(device))
        if problem:
            raise UserError(f"fp8_attention: {problem}", field="search.memory.fp8_attention")


def check_nproc(space: Space) -> None:
    """The ``probe.nproc`` checks alone (for a probe launched on several processes)."""
    _check_nproc(space)
    _check_nproc_gpus(space)


def _check_nproc(space: Space) -> None:
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


#: Backends that split a probe's blocks over ranks (:mod:`precsearch.probe.tensor_parallel`).
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


def _check_nproc_gpus(space: Space) -> None:
    nproc = space.probe.nproc
    if nproc == 1:
        return
    try:
        device = resolve_device(space.probe.device)
    except BackendUnavailable as exc:
        raise UserError(str(exc), field="probe.device") from None
    visible = torch.cuda.device_count() if device.type == "cuda" else None
    if visible is not None and nproc > visible:
        raise UserError(f"nproc {nproc} needs {nproc} GPUs (one process each) but {visible} visible; "
                        f"valid: 1 to {visible}", field="probe.nproc")
