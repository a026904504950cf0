"""Probes that span several processes: one per GPU (NCCL), or several CPU processes (gloo), with FSDP2.

Some targets do not fit one GPU at their real width and sequence length (a
Llama-3-70B-shaped probe at sequence length 8192). :func:`run_distributed_probe`
runs such a probe on ``probe.nproc`` processes: it writes the request (space,
probe section, policy) to a JSON file, launches ``torchrun`` on this module,
and reads back the :class:`ProbeResult` that rank 0 writes. Each rank runs the
ordinary probe loop (:func:`precsearch.probe.runner.run_probe`) with a
:class:`~precsearch.probe.runner.Parallel` that shards the model and averages
the losses over ranks.

How it stays comparable with the one-process probe:

* **The batch is split, not multiplied.** ``probe.micro_batch`` is the global
  batch; rank ``r`` trains rows ``r*b .. (r+1)*b - 1`` of every batch
  (``b = micro_batch / nproc``) and evaluates the same share of every held-out
  batch. Each rank's loss is the mean over its rows, FSDP2 averages the
  gradients over ranks, and equal row counts make that average the gradient of
  the whole batch's mean loss: the same optimisation problem, seed, data order
  and held-out set as the one-process probe, so the BF16 reference and the
  loss gap mean the same thing.
* **Same weights on every rank.** Each rank builds the probe from the same seed
  and converts it with the same backend; a checksum over ranks refuses to
  start if they differ. Then ``fully_shard`` wraps every transformer block and
  then the root (``torch.distributed.fsdp``, FSDP2), with the gradient
  reduction in FP32 (``MixedPrecisionPolicy(reduce_dtype=torch.float32)``);
  compute stays under ``torch.autocast`` to BF16 as in the one-process probe.
* **Delayed scaling sees the whole batch.** Transformer Engine reduces
  delayed-scaling amaxes over ranks (max) before each scale update: with
  ``amax_reduction_group=None`` the group is the world, and
  ``DelayedScaling.reduce_amax`` is on by default
  (``transformer_engine/pytorch/quantization.py``,
  ``reduce_and_update_fp8_tensors``). The emulated backend does the same: its
  delayed scalers record the max of the ranks' amaxes, which is the amax of the
  whole batch, so scales match the one-process probe. Current, block, MXFP8 and
  NVFP4 scaling quantize each rank's own tensors, as TE does in data parallelism
  (TE reduces NVFP4's tensor amax only for tensors it gathers, as with sequence parallelism).
  Each rank's loss gradient is ``nproc`` times the whole-batch one; per-tensor
  and per-block scales absorb that factor exactly for a power-of-two ``nproc``.
* **Memory per rank.** On a GPU each rank measures its own peak
  (``torch.cuda.max_memory_allocated``, reset once the model is sharded, so the
  full-size build before sharding is not counted); on CPU each rank reports
  :func:`predict_rank_peak`. ``ProbeResult.per_rank_peak_bytes`` lists them and
  ``peak_memory_bytes`` is the largest. ``tokens_per_s`` counts the global batch.

Transformer Engine under FSDP2 (checked in TE 2.20's source): a ``te.Linear``
inside a ``fully_shard``-ed block finds its FSDP state through its closest
sharded parent (``transformer_engine/pytorch/distributed.py``,
``_get_module_fsdp_state``) and then skips caching the transposed FP8 weight in
the forward (``module/linear.py``: ``columnwise_usage = ... and not is_fsdp2``),
re-quantizing it from the re-gathered weight in the backward; nothing needs
turning on. TE's own FSDP2 test (``tests/pytorch/distributed/fsdp2_tests``)
copies parameters' Python attributes across ``fully_shard``, which replaces the
Parameters; :func:`_shard` does the same. FP8 weight storage, FP32 master
weights and TE ``FusedAdam`` are not verified with FSDP2 here and are refused
(:func:`precsearch.config.checks.check_nproc`).

The torchrun entry is :func:`main` (``python -m torch.distributed.run ... -m
precsearch.probe.distributed REQUEST RESULT``). NVLink multicast stays off
(``NCCL_NVLS_ENABLE=0`` and its PyTorch/NVSHMEM twins) in every launch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

import precsearch
from precsearch.config.space import ProbeSection, Space
from precsearch.fp8.scaling import DelayedScaler
from precsearch.policy import Policy
from precsearch.probe.data import TokenBatches, load_batches
from precsearch.probe.calibration import Calibration, DepthMeasurement, fit_calibration
from precsearch.probe.memory import MemoryBreakdown, predict_peak
from precsearch.probe.model import ModelConfig
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import Parallel, StepCallback, backend_precisions, run_probe

#: The module torchrun starts on every rank (tests point it at a worker that fails on purpose).
_WORKER = "precsearch.probe.distributed"
#: Set in every launch: NVLink multicast can take a shared host's GPUs out of service.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_STDERR_LINES = 20
_POLL_S = 0.2


class DistributedProbeError(RuntimeError):
    """A probe on several processes failed: a rank raised or died, or it ran out of time.

    Attributes:
        rank: The rank that failed first (None when it cannot be told, or on a timeout).
        stderr_tail: The last lines that rank (or the launcher) wrote to stderr.
    """

    def __init__(self, message: str, *, rank: int | None = None, stderr_tail: str = ""):
        super().__init__(message)
        self.rank = rank
        self.stderr_tail = stderr_tail


def run_distributed_probe(space: Space, probe: ProbeSection, policy: Policy, label: str, *,
                          on_step: StepCallback | None = None, timeout: float | None = None) -> ProbeResult:
    """Run one probe of ``policy`` on ``probe.nproc`` processes (torchrun, FSDP2) and return its result.

    Args:
        space: The space (model, data, backend); its probe section is replaced by ``probe``.
        probe: The probe section to run (``nproc`` processes; ``micro_batch`` is the global batch).
        policy: The precision policy.
        label: Names the probe in errors ("trial 3", "BF16 reference").
        on_step: Called in this process with (step, loss, grad_norm) as rank 0 reports each step.
        timeout: Seconds before the whole launch is killed (None: no limit).

    Raises:
        UserError: ``probe.nproc`` cannot run here (see :func:`precsearch.config.checks.check_nproc`).
        DistributedProbeError: A rank failed (naming it, with its last stderr lines) or time ran out.
    """
    from precsearch.config.checks import check_nproc

    space = space.model_copy(update={"probe": probe})
    check_nproc(space)
    with tempfile.TemporaryDirectory(prefix="precsearch-dist-") as tmp:
        work = Path(tmp)
        request = {"space": space.model_dump(mode="json"), "policy": policy.to_dict(), "label": label}
        (work / "request.json").write_text(json.dumps(request))
        returncode = _launch_and_wait(work, probe.nproc, on_step, timeout, label)
        done = (work / "result.json").exists()  # written after the final barrier: training is complete
        if returncode != 0 and not done:
            raise _failure(work, label, probe.nproc, returncode)
        if returncode != 0:
            # seen on CPU (gloo), rarely: a rank aborts while tearing down after the result is written
            warnings.warn(f"{_failure(work, label, probe.nproc, returncode)}\n(after the probe finished; its "
                          "result is complete and kept)", RuntimeWarning, stacklevel=2)
        return ProbeResult.from_dict(json.loads((work / "result.json").read_text()))


#: torchrun, after asking Linux for SIGTERM when the launching process dies, even by SIGKILL; torchrun
#: answers SIGTERM by stopping its ranks, so a killed caller leaves no probe holding the GPUs. (Done in
#: the child after exec, not in a preexec_fn, which is unsafe when the caller runs threads.)
_TORCHRUN = ("import ctypes, runpy, signal, sys; "
             "sys.platform.startswith('linux') and ctypes.CDLL(None).prctl(1, signal.SIGTERM); "  # PR_SET_PDEATHSIG
             "sys.argv[0] = 'torchrun'; runpy.run_module('torch.distributed.run', run_name='__main__')")


def _command(work: Path, nproc: int) -> list[str]:
    return [sys.executable, "-c", _TORCHRUN, "--standalone", "--nproc-per-node", str(nproc),
            "--log-dir", str(work / "logs"), "--redirects", "3",
            "-m", _WORKER, str(work / "request.json"), str(work / "result.json")]


def _environment() -> dict[str, str]:
    env = dict(os.environ) | NO_MULTICAST | {"PYTHONUNBUFFERED": "1"}
    # the ranks import the same precsearch as this process, wherever it was found
    root = str(Path(precsearch.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _launch_and_wait(work: Path, nproc: int, on_step: StepCallback | None, timeout: float | None,
                     label: str) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    progress = _Progress(work / "progress.jsonl", on_step)
    with open(work / "launcher.log", "wb") as log:
        # a session of its own, so that a timeout ends torchrun and every rank it started
        proc = subprocess.Popen(_command(work, nproc), env=_environment(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                progress.read()
                if deadline is not None and time.monotonic() > deadline:
                    _stop(proc)
                    raise DistributedProbeError(f"distributed probe '{label}' did not finish within {timeout:g} s",
                                                stderr_tail=_tail(work / "launcher.log"))
                time.sleep(_POLL_S)
        except BaseException:
            _stop(proc)
            raise
    progress.read()
    return proc.returncode


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class _Progress:
    """Reads the steps rank 0 appends to ``path`` and hands each one to ``on_step``, once."""

    def __init__(self, path: Path, on_step: StepCallback | None):
        self.path, self.on_step, self.offset = path, on_step, 0

    def read(self) -> None:
        if self.on_step is None or not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self.offset += len(complete)
        for line in complete.splitlines():
            step = json.loads(line)
            self.on_step(step["step"], step["loss"], step["grad_norm"])


def _failure(work: Path, label: str, nproc: int, returncode: int) -> DistributedProbeError:
    """The error for a failed launch: the rank that failed first, what it raised, its last stderr lines."""
    ranks = {int(d.name): d for d in (work / "logs").glob("*/attempt_*/*") if d.name.isdigit()}
    errors = []
    for rank, folder in ranks.items():
        if (folder / "error.json").exists():
            message = json.loads((folder / "error.json").read_text())["message"]
            errors.append((int(message["extraInfo"]["timestamp"]), rank, message["message"]))
    launcher = _tail(work / "launcher.log", 200)
    if errors:
        _, rank, what = min(errors)
    else:  # killed by a signal (out of memory, a segfault): only the launcher's summary names the rank
        found = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*([^\n]*)", launcher, re.S)
        rank = int(found.group(1)) if found else None
        what = f"exit code {found.group(2).strip()}" if found else f"torchrun exit status {returncode}"
    tail, source = (_tail(ranks[rank] / "stderr.log") if rank in ranks else ""), "its stderr"
    if not tail:
        tail, source = "\n".join(launcher.splitlines()[-_STDERR_LINES:]), "torchrun's report"
    where = f"rank {rank} of {nproc}" if rank is not None else f"one of {nproc} ranks"
    return DistributedProbeError(
        f"distributed probe '{label}' failed on {where}: {what}\nlast lines of {source}:\n{tail}",
        rank=rank, stderr_tail=tail)


def _tail(path: Path, lines: int = _STDERR_LINES) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class RankBatches:
    """This rank's rows of every batch of a :class:`TokenBatches` (the batch split evenly over ranks).

    It offers what the probe loop reads (``train_batch``, ``eval_set``), so
    :func:`run_probe` runs on it unchanged.
    """

    def __init__(self, data: TokenBatches, rank: int, world: int):
        if data.micro_batch % world:
            raise ValueError(f"micro_batch {data.micro_batch} does not split evenly over {world} ranks")
        self.data, self.rank, self.world = data, rank, world

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return t.chunk(self.world)[self.rank]

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the step's ``(inputs, targets)``."""
        inputs, targets = self.data.train_batch(step)
        return self._rows(inputs), self._rows(targets)

    def eval_set(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's rows of each held-out batch."""
        return [(self._rows(i), self._rows(t)) for i, t in self.data.eval_set()]


def predict_rank_peak(cfg: ModelConfig, probe: ProbeSection, policy: Policy) -> MemoryBreakdown:
    """The memory model's peak for one of ``probe.nproc`` FSDP2 ranks (``micro_batch`` is the global batch).

    Parameters, gradients, optimizer state and its temporaries are split over
    the ranks. Activations and logits are those of the rank's own rows.
    ``weight_copies`` holds what the backward sees unsharded: the parameters of
    the root (embeddings, final norm, head, which FSDP2 keeps gathered after the
    forward) and of two blocks (the one computing and the one prefetched), plus
    autocast's BF16 casts of BF16 layers as on one process. FP8 layers keep no
    weight copy: under FSDP2 Transformer Engine re-quantizes the weight from the
    re-gathered one in the backward (``module/linear.py``, "Backward will
    re-quantize from the FSDP2 all-gathered weight", TE issue #2681).
    """
    nproc = probe.nproc
    sizes = dict(seq_len=probe.seq_len, micro_batch=probe.micro_batch // nproc, param_dtype=probe.param_dtype)
    precisions = backend_precisions(policy, cfg)
    own = predict_peak(cfg, precisions, **sizes, memory=policy.memory)
    # with fp8_weights the model counts no copy for FP8 layers and the same copies for BF16 ones
    bf16_copies = predict_peak(cfg, precisions, **sizes,
                               memory=dataclasses.replace(policy.memory, fp8_weights=True)).weight_copies
    root = 2 * cfg.vocab_size * cfg.dim + cfg.dim
    block = (cfg.num_params() - root) // cfg.n_layers
    gathered = (root + 2 * block) * (4 if probe.param_dtype == "fp32" else 2)
    return dataclasses.replace(
        own, params=_split(own.params, nproc), grads=_split(own.grads, nproc),
        optimizer=_split(own.optimizer, nproc),
        weight_copies=bf16_copies + gathered)


def _split(total: int, nproc: int) -> int:
    return -(-total // nproc)  # FSDP2 pads each parameter to a multiple of the ranks


# ---- the torchrun side: every rank runs this ----


@record
def main(argv: list[str] | None = None) -> None:
    """torchrun entry: ``REQUEST RESULT``; every rank trains its share, rank 0 writes the result JSON."""
    request_path, result_path = argv if argv is not None else sys.argv[1:]
    request = json.loads(Path(request_path).read_text())
    space = Space.model_validate(request["space"])
    policy = Policy.from_dict(request["policy"])
    device = _init_process_group(space.probe)
    try:
        progress = Path(result_path).with_name("progress.jsonl")
        result = _run_rank(space, policy, device, progress)
        dist.barrier()  # every rank is done with every collective before any starts tearing down
        if dist.get_rank() == 0:
            partial = Path(result_path).with_suffix(".partial")
            partial.write_text(json.dumps(result.to_dict()))
            partial.replace(result_path)
    finally:
        dist.destroy_process_group()


def _init_process_group(probe: ProbeSection) -> torch.device:
    from precsearch.backends import resolve_device

    device = resolve_device(probe.device)
    if device.type != "cuda":
        dist.init_process_group("gloo")
        return device
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def _run_rank(space: Space, policy: Policy, device: torch.device, progress: Path) -> ProbeResult:
    from precsearch.backends import get_backend

    rank, world = dist.get_rank(), dist.get_world_size()
    cfg, probe = space.model.probe(), space.probe
    data = RankBatches(load_batches(space), rank, world)
    parallel = Parallel(shard=lambda model: _shard(model, device), mean=_mean_over_ranks)
    on_step = _progress_writer(progress) if rank == 0 else None
    backend = get_backend(space.backend.value, device, needs=space.search.precisions())
    result = run_probe(cfg, probe, policy, data, backend, device, on_step, parallel=parallel)
    own = predict_rank_peak(cfg, probe, policy)
    result.predicted_memory = own.to_dict()
    if result.memory_source != "measured":
        result.peak_memory_bytes = own.total
    peaks: list[int] = [0] * world
    dist.all_gather_object(peaks, int(result.peak_memory_bytes))
    result.per_rank_peak_bytes, result.peak_memory_bytes = peaks, max(peaks)
    result.device = f"{world} x {device.type} (FSDP2)"
    _predict_target_per_rank(result, space, policy, own.total)
    return result


def _predict_target_per_rank(result: ProbeResult, space: Space, policy: Policy, predicted_rank_bytes: int) -> None:
    """The target's peak per GPU when trained like the probe (FSDP2 over ``probe.nproc`` GPUs).

    Calibrated from this probe's largest per-rank measurement against the per-rank model (one depth:
    a fixed offset, :mod:`precsearch.probe.calibration`); on CPU, the per-rank model as is.
    """
    cfg, target = space.model.probe(), space.model.target()
    calibration = Calibration()
    if result.memory_source == "measured" and len(result.losses) >= 2:
        calibration = fit_calibration([DepthMeasurement(cfg.n_layers, predicted_rank_bytes, result.peak_memory_bytes)])
    rank_target = predict_rank_peak(target, space.probe, policy)
    result.target_memory_bytes = calibration.correct(rank_target.total, target.n_layers)
    result.target_memory_source = calibration.source
    result.target_layers = target.n_layers
    result.memory_calibration = calibration.to_dict()


def _progress_writer(path: Path) -> StepCallback:
    def write(step: int, loss: float, grad_norm: float) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "loss": loss, "grad_norm": grad_norm}) + "\n")

    return write


def _shard(model: nn.Module, device: torch.device) -> None:
    """FSDP2 over every transformer block, then the root; FP32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _check_same_weights(model)
    attrs = {n: {k: v for k, v in vars(p).items() if not k.startswith("_")} for n, p in model.named_parameters()}
    mp = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    for block in model.decoder.layers:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    for name, param in model.named_parameters():  # fully_shard made new Parameters: keep TE's attributes
        for key, value in attrs.get(name, {}).items():
            setattr(param, key, value)
    _reduce_delayed_amax(model)
    if device.type == "cuda":  # measure training, not the full-size build that came before sharding
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _check_same_weights(model: nn.Module) -> None:
    sums = torch.stack([p.detach().sum(dtype=torch.float64) for p in model.parameters()]).to(_collective_device())
    ranks = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(ranks, sums)
    for rank, other in enumerate(ranks):
        if not torch.allclose(other, ranks[0], rtol=1e-9, atol=0.0):
            raise RuntimeError(f"rank {rank} built different weights from rank 0 with the same seed; "
                               "FSDP2 would shard inconsistent copies")


class _RankMaxDelayedScaler(DelayedScaler):
    """A delayed scaler that records the max of every rank's amax (what TE reduces before its update)."""

    def _observe(self, x: torch.Tensor) -> None:
        amax = x.detach().abs().amax().float().reshape(1) if x.numel() else x.new_zeros(1, dtype=torch.float32)
        dist.all_reduce(amax, op=dist.ReduceOp.MAX)
        super()._observe(amax)


def _reduce_delayed_amax(model: nn.Module) -> None:
    from precsearch.backends.emulated import EmulatedFP8Linear

    for layer in model.modules():
        if not isinstance(layer, EmulatedFP8Linear):
            continue
        for role in ("input_scaler", "weight_scaler", "grad_output_scaler"):
            s = getattr(layer, role)
            if type(s) is DelayedScaler:
                setattr(layer, role, _RankMaxDelayedScaler(s.fmt, s.history_len, s.algo, s.margin, s.track_stats))


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _mean_over_ranks(value: float) -> float:
    total = torch.tensor(value, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


if __name__ == "__main__":
    main()
