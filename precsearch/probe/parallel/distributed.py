"""Probes that span several processes: one per GPU (NCCL), or several CPU processes (gloo), with FSDP2.

Some targets do not fit one GPU at their real width and sequence length (a
Llama-3-70B-shaped probe at sequence length 8192). :func:`run_distributed_probe`
runs such a probe on ``probe.nproc`` processes: it writes the request (space,
probe section, policy) to a JSON file, launches ``torchrun`` on this module,
and reads back the :class:`ProbeResult` that rank 0 writes. Each rank runs the
ordinary probe loop (:func:`precsearch.probe.runner.run_probe`) with a
:class:`~precsearch.probe.runner.Parallel` that shards the model and averages
the losses over ranks.

With ``probe.tp`` = T > 1 the ranks form ``nproc / T`` data-parallel groups of
T tensor-parallel ranks (TP innermost, as Megatron lays them out): each group
splits every block's GEMMs over its ranks (:mod:`precsearch.probe.parallel.tensor_parallel`),
the groups shard with FSDP2 and split the batch as below (a group is one
"rank" of what follows), and gradient norms are summed over TP slices and
FSDP2 shards alike (:func:`~precsearch.probe.parallel.tensor_parallel.clip_grad_norm`).
With T = ``nproc`` there is no FSDP2.

How it stays comparable with the one-process probe:

* **The batch is split, not multiplied.** ``probe.micro_batch`` is the global
  batch; rank ``r`` trains rows ``r*b .. (r+1)*b - 1`` of every batch
  (``b = micro_batch / nproc``) and evaluates the same share of every held-out
  batch. Each rank's loss is the mean over its rows, FSDP2 averages the
  gradients over ranks, and equal row counts make that average the gradient of
  the whole batch's mean loss: the same optimisation problem, seed, data order
  and held-out set as the one-process probe, so the BF16 reference and the
  loss gap mean the same thing.
* **Same weights on every rank.** Each rank builds the probe from the same seed;
  a checksum over ranks of the whole build (before any TP slicing and the
  backend's conversion) refuses to start if they differ. Then ``fully_shard`` wraps every transformer block and
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
  :func:`~precsearch.probe.memory.rank_peak.predict_rank_peak`. ``ProbeResult.per_rank_peak_bytes`` lists them and
  ``peak_memory_bytes`` is the largest. ``tokens_per_s`` counts the global batch.

Transformer Engine under FSDP2 (checked in TE 2.20's source): a ``te.Linear``
inside a ``fully_shard``-ed block finds its FSDP state through its closest
sharded parent (``transformer_engine/pytorch/distributed.py``,
``_get_module_fsdp_state``) and then skips caching the transposed FP8 weight in
the forward (``module/linear.py``: ``columnwise_usage = ... and not is_fsdp2``),
re-quantizing it from the re-gathered weight in the backward; nothing needs
turning on. TE's own FSDP2 test (``tests/pytorch/distributed/fsdp2_tests``)
copies parameters' Python attributes across ``fully_shard``, which replaces the
Parameters; ``distributed_rank._shard`` does the same. FP8 weight storage, FP32 master
weights and TE ``FusedAdam`` are not verified with FSDP2 here and are refused
(:func:`precsearch.config.checks.check_nproc`).

The torchrun entry is :func:`precsearch.probe.parallel.distributed_rank.main` (``python -m
torch.distributed.run ... -m precsearch.probe.parallel.distributed_rank REQUEST RESULT``). NVLink multicast
stays off (``NCCL_NVLS_ENABLE=0`` and its PyTorch/NVSHMEM twins) in every launch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from precsearch.backends import BackendUnavailable, resolve_device
from precsearch.config.space import ProbeSection, Space
from precsearch.errors import UserError
from precsearch.policy import Policy
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import StepCallback
from precsearch.utils.processes import dying_with_parent, stop_group

#: The module torchrun starts on every rank (tests point it at a worker that fails on purpose).
_WORKER = "precsearch.probe.parallel.distributed_rank"
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
        UserError: ``probe.nproc`` cannot run here (:func:`precsearch.config.checks.check_nproc`,
            :func:`check_gpus`).
        DistributedProbeError: A rank failed (naming it, with its last stderr lines) or time ran out.
    """
    from precsearch.config.checks import check_nproc

    space = space.model_copy(update={"probe": probe})
    check_nproc(space)
    check_gpus(space)
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


def check_gpus(space: Space) -> None:
    """On a GPU, ``probe.nproc`` processes need as many visible GPUs (one each); else a UserError saying how
    many there are."""
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


def _command(work: Path, nproc: int) -> list[str]:
    torchrun = dying_with_parent([sys.executable, "-m", "torch.distributed.run"], argv0="torchrun")
    return [*torchrun, "--standalone", "--nproc-per-node", str(nproc),
            "--log-dir", str(work / "logs"), "--redirects", "3",
            "-m", _WORKER, str(work / "request.json"), str(work / "result.json")]


def _environment() -> dict[str, str]:
    env = dict(os.environ) | NO_MULTICAST | {"PYTHONUNBUFFERED": "1"}
    # the ranks import the same precsearch as this process, wherever it was found
    root = str(Path(__file__).resolve().parents[3])
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
                    stop_group(proc, grace_s=15)
                    raise DistributedProbeError(f"distributed probe '{label}' did not finish within {timeout:g} s",
                                                stderr_tail=_tail(work / "launcher.log"))
                time.sleep(_POLL_S)
        except BaseException:
            stop_group(proc, grace_s=15)
            raise
    progress.read()
    return proc.returncode


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
