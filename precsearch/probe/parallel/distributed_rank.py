"""The torchrun side of a distributed probe: what every rank runs (:mod:`precsearch.probe.parallel.distributed`).

:func:`main` reads the request the launching process wrote, builds and shards the probe on this
rank (FSDP2), trains this rank's share of every batch, and rank 0 writes the result. How this
stays comparable with the one-process probe is explained in :mod:`precsearch.probe.parallel.distributed`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from precsearch.config.space import ProbeSection, Space
from precsearch.fp8.scaling import DelayedScaler
from precsearch.policy import Policy
from precsearch.probe.data import TokenBatches, load_batches
from precsearch.probe.memory.calibration import Calibration, DepthMeasurement, fit_calibration
from precsearch.probe.memory.rank_peak import predict_rank_peak
from precsearch.probe.result import ProbeResult
from precsearch.probe.runner import Parallel, StepCallback, clip_unless_nonfinite, run_probe
from precsearch.probe.parallel.tensor_parallel import TensorParallel, clip_grad_norm, split_model, sum_partial_grads

__all__ = ["RankBatches", "main", "predict_rank_peak"]  # predict_rank_peak: see precsearch.probe.memory.rank_peak


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

    @property
    def grad_accum(self) -> int:
        """Micro-batches per step."""
        return self.data.grad_accum

    @property
    def seed(self) -> int:
        """The seed of the training windows."""
        return self.data.seed

    def with_seed(self, seed: int) -> "RankBatches":
        """This rank's rows of :meth:`TokenBatches.with_seed`."""
        return RankBatches(self.data.with_seed(seed), self.rank, self.world)

    def train_batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the step's micro-batch ``micro`` as ``(inputs, targets)``."""
        inputs, targets = self.data.train_batch(step, micro)
        return self._rows(inputs), self._rows(targets)

    def eval_set(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's rows of each held-out batch."""
        return [(self._rows(i), self._rows(t)) for i, t in self.data.eval_set()]


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
    mesh = _Mesh.build(device, world, probe)
    data = RankBatches(load_batches(space), mesh.dp_rank, mesh.dp_size)
    on_step = _progress_writer(progress) if rank == 0 else None
    backend = get_backend(space.backend.value, device, needs=space.search.precisions())
    result = run_probe(cfg, probe, policy, data, backend, device, on_step, parallel=mesh.parallel(device),
                       init=space.model.start())
    own = predict_rank_peak(cfg, probe, policy)
    result.predicted_memory = own.to_dict()
    if result.memory_source != "measured":
        result.peak_memory_bytes = own.total
    peaks: list[int] = [0] * world
    dist.all_gather_object(peaks, int(result.peak_memory_bytes))
    result.per_rank_peak_bytes, result.peak_memory_bytes = peaks, max(peaks)
    result.device = f"{world} x {device.type} ({mesh.describe()})"
    _predict_target_per_rank(result, space, policy, own.total)
    return result


class _Mesh:
    """The probe's ranks as ``dp_size`` data-parallel groups of ``tp`` tensor-parallel ranks (TP innermost:
    the ranks of a TP group are neighbours, on one host, as Megatron lays them out)."""

    def __init__(self, mesh, tp: TensorParallel | None, dp_group, dp_rank: int, dp_size: int):
        self.mesh, self.tp, self.dp_group, self.dp_rank, self.dp_size = mesh, tp, dp_group, dp_rank, dp_size

    @classmethod
    def build(cls, device: torch.device, world: int, probe: ProbeSection) -> "_Mesh":
        from torch.distributed.device_mesh import init_device_mesh

        tp_size = probe.tp
        mesh = init_device_mesh(device.type, (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
        tp = None
        if tp_size > 1:
            tp = TensorParallel(mesh["tp"].get_group(), tp_size, mesh["tp"].get_local_rank(), probe.sequence_parallel)
        return cls(mesh, tp, mesh["dp"].get_group(), mesh["dp"].get_local_rank(), world // tp_size)

    def describe(self) -> str:
        parts = ([f"TP {self.tp.size}" + (" + SP" if self.tp.sequence_parallel else "")] if self.tp else [])
        parts += [f"FSDP2 {self.dp_size}" if self.tp else "FSDP2"] if self.dp_size > 1 else []
        return " x ".join(parts)

    def parallel(self, device: torch.device) -> Parallel:
        tp, dp = self.tp, (self.mesh["dp"] if self.dp_size > 1 else None)
        dp_group = self.dp_group if dp is not None else None  # replicated grads are FSDP2-sharded only with dp

        def split(model: nn.Module) -> None:
            _check_same_weights(model)  # the whole seeded build, before any rank keeps its slice
            if tp is not None:
                split_model(model, tp)

        def clip(model: nn.Module, max_norm: float) -> torch.Tensor:
            if tp is None:
                return clip_unless_nonfinite(model, max_norm)
            sum_partial_grads(model, tp)
            return clip_grad_norm(model, max_norm, tp, dp_group)

        return Parallel(split=split, shard=lambda model: _shard(model, device, dp), mean=_mean_over_ranks, clip=clip,
                        first=_first_over_ranks)


def _predict_target_per_rank(result: ProbeResult, space: Space, policy: Policy, predicted_rank_bytes: int) -> None:
    """The target's peak per GPU when trained like the probe (split over ``probe.nproc`` GPUs the same way).

    Calibrated from this probe's largest per-rank measurement against the per-rank model (one depth:
    a fixed offset, :mod:`precsearch.probe.memory.calibration`); on CPU, the per-rank model as is. The
    breakdown (what a trial's memory was saved from) is the per-rank model's too.
    """
    cfg, target = space.model.probe(), space.model.target()
    calibration = Calibration()
    if result.memory_source == "measured" and len(result.losses) >= 2:
        calibration = fit_calibration([DepthMeasurement(cfg.n_layers, predicted_rank_bytes, result.peak_memory_bytes)])
    rank_target = predict_rank_peak(target, space.probe, policy)
    result.target_memory_bytes = calibration.correct(rank_target.total, target.n_layers)
    result.target_breakdown = rank_target.components()
    result.target_memory_source = calibration.source
    result.target_layers = target.n_layers
    result.memory_calibration = calibration.to_dict()


def _progress_writer(path: Path) -> StepCallback:
    def write(step: int, loss: float, grad_norm: float) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "loss": loss, "grad_norm": grad_norm}) + "\n")

    return write


def _shard(model: nn.Module, device: torch.device, dp_mesh=None) -> None:
    """FSDP2 over every transformer block, then the root, across ``dp_mesh`` (FP32 gradient reduction);
    none without one (a probe split by tensor parallelism alone)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if dp_mesh is not None:
        attrs = {n: {k: v for k, v in vars(p).items() if not k.startswith("_")} for n, p in model.named_parameters()}
        mp = MixedPrecisionPolicy(reduce_dtype=torch.float32)
        for block in model.decoder.layers:
            fully_shard(block, mesh=dp_mesh, mp_policy=mp)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp)
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
    """A delayed scaler that records the max of every rank's amax (what TE reduces before its update).

    The reduction spans the world, TP and data-parallel ranks alike: a tensor split over a TP group
    gets the whole tensor's amax, so every rank quantizes it with one scale (Megatron-LM #442).
    """

    def _observe(self, x: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        if amax is None:
            amax = x.detach().abs().amax().float() if x.numel() else x.new_zeros((), dtype=torch.float32)
        amax = amax.reshape(1).clone()  # reduced in place: the caller's tensor stays this rank's
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


def _first_over_ranks(found: str | None) -> str | None:
    """The first rank's finding of a non-finite tensor (a name), or None when no rank found one."""
    anyone = torch.tensor(int(found is not None), dtype=torch.int32, device=_collective_device())
    dist.all_reduce(anyone)  # every step: one small all-reduce; the names travel only when some rank found one
    if not int(anyone):
        return None
    every: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, found)
    return next((f for f in every if f is not None), None)


def _mean_over_ranks(value: float) -> float:
    total = torch.tensor(value, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


if __name__ == "__main__":
    main()
