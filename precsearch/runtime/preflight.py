"""The checks a space must pass on this machine before a study runs: its files, its data, its backend and GPUs.

:func:`precsearch.config.checks.check_space` checks the file alone (it holds for any machine); the CLI
then runs :func:`preflight` (``precsearch run`` and ``validate``): the checkpoint and data files are
there, the data reads as a probe would read it, the backend runs every precision and memory knob the
space can choose on this device, and there are GPUs for ``probe.nproc``. Each raises
:class:`~precsearch.errors.UserError` naming the space file and the field.
"""

from __future__ import annotations

from precsearch.arch.checkpoint import check_checkpoint
from precsearch.backends import BackendUnavailable, UnsupportedRecipe, backend_support, get_backend, resolve_device
from precsearch.config.checks import MEMORY_KNOB_NAMES
from precsearch.config.data_source import FILE_SOURCES, PREFIX_SOURCES, DataSource
from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import LayerRecipe
from precsearch.probe.data import check_data


def preflight(space: Space, *, file: str, gpu: bool = True) -> None:
    """This machine's checks of ``space`` (read from ``file``), in the order a user would fix them.

    The data is read once as a probe would read it, so a bad data file stops the run here, not in
    every trial's probe process. With ``gpu=False`` the checks that need the space's GPU
    (:func:`gpu_checks_left`) are left out: a GPU space's checkpoint and data are checked on a CPU
    machine before the GPU is rented.
    """
    machine = (_check_backend, _check_gpus) if gpu else ()
    for check in (_check_checkpoint, _check_data_files, *machine, check_data):
        try:
            check(space)
        except UserError as exc:
            raise exc.located(file=file) from None


def gpu_checks_left(space: Space) -> list[str]:
    """What :func:`preflight` cannot check for ``space`` on this machine because it has no CUDA GPU and the
    space asks for one (``probe.device: cuda`` or ``backend: te``); empty when it can check everything."""
    if space.probe.device != "cuda" and space.backend.value != "te":
        return []
    import torch  # a GPU query: a space that names none needs no torch to validate

    if torch.cuda.is_available():
        return []
    precisions = ", ".join(sorted(p.value for p in space.search.precisions()))
    left = [f"probe.device {space.probe.device}: a CUDA GPU is visible",
            f"backend {space.backend.value}: it runs {precisions} on that GPU (its compute capability)",
            "search.memory and objectives.baseline_memory: the backend supports the memory knobs"]
    if space.probe.nproc > 1:
        left.append(f"probe.nproc {space.probe.nproc}: that many GPUs are visible")
    return left



def _check_checkpoint(space: Space) -> None:
    """Every tensor the probe takes from ``model.init_from`` is there, with the config's shape."""
    start = space.model.start()
    if start is not None:
        check_checkpoint(start.path, start.layers)


def _check_data_files(space: Space) -> None:
    data = space.data
    for field, path in (("data.path", data.path), ("data.tokenizer", data.tokenizer)):
        # /dev/zero or a pipe: reading it would never end (or block), not fail
        if path is not None and path.exists() and not (path.is_file() or path.is_dir()):
            raise UserError(f"{path} is not a regular file or directory (a device, pipe or socket); give a "
                            "data file", field=field)
    # a prefix path (megatron) names several files: its reader checks them (check_data)
    if data.source in FILE_SOURCES and data.source not in PREFIX_SOURCES and not data.path.exists():
        raise UserError(f"data file not found: {data.path}", field="data.path")
    if data.tokenizer is not None and not data.tokenizer.exists():
        raise UserError(f"tokenizer not found: {data.tokenizer}", field="data.tokenizer")
    byte_level = data.source == DataSource.STDLIB or (data.source == DataSource.TEXT and data.tokenizer is None)
    # (jsonl / hf_disk texts without a tokenizer are bytes too, unless they hold token ids: check_data reads them)
    if byte_level and space.model.probe().vocab_size < 256:
        raise UserError("byte-level data needs vocab_size >= 256", field="model.vocab_size")


def _check_gpus(space: Space) -> None:
    if space.probe.nproc > 1:  # one process needs no GPU count (and no torch)
        from precsearch.probe.parallel.distributed import check_gpus

        check_gpus(space)


def _check_backend(space: Space) -> None:
    # a CPU space's emulated backend answers as data; any other takes torch (a GPU query, a library)
    device = space.probe.device
    backend = backend_support(space.backend.value, device, space.search.precisions())
    if backend is None:
        device, backend = _built_backend(space)
    _check_memory_knobs(space, backend, device)
    fields = {f"search.groups[{i}].precision": g.precision for i, g in enumerate(space.search.groups)}
    fields |= {f"search.units[{i}].precision": u.precision for i, u in enumerate(space.search.units)}
    fields["search.default_precision"] = space.search.default_precision
    for field, knob in fields.items():
        try:
            backend.check_supported({f"{field}={p.value}": LayerRecipe(precision=p) for p in knob.options()}, device)
        except UnsupportedRecipe as exc:
            raise UserError(str(exc), field=field) from None


def _built_backend(space: Space):
    """The space's device and backend, built (torch, and the backend's library)."""
    try:
        device = resolve_device(space.probe.device)
    except BackendUnavailable as exc:
        raise UserError(str(exc), field="probe.device") from None
    try:
        return device, get_backend(space.backend.value, device, needs=space.search.precisions())
    except BackendUnavailable as exc:
        raise UserError(str(exc), field="backend") from None


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
        from precsearch.backends.capability import gpu_capability
        from precsearch.backends.te_knobs import fp8_attention_model_problem

        problem = fp8_attention_model_problem(space.model.probe().head_dim, gpu_capability(device))
        if problem:
            raise UserError(f"fp8_attention: {problem}", field="search.memory.fp8_attention")
