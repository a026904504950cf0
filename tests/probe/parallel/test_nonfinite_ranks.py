"""A non-finite value on one rank of a probe spread over processes (FSDP2 on two gloo ranks).

Each rank checks only its own shards, so the ranks must agree on the finding (``Parallel.first``): if they did
not, the rank that found nothing would go on to the next step's collectives while the other stopped, and the
run would hang (the spawn's timeout) or write a result that names nothing.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.parallel.distributed_rank import RankBatches, _Mesh
from precsearch.probe.runner import run_probe

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
PROBE = ProbeSection(steps=5, micro_batch=4, seq_len=32, lr=3e-3, device="cpu", schedule="constant",
                     lr_warmup_steps=0, nproc=2)
TARGET = "decoder.layers.1.mlp.linear_fc1.weight"
CPU = torch.device("cpu")


class _RankFault(EmulatedBackend):
    """A NaN in this rank's shard of TARGET's ``exp_avg_sq`` right after the optimizer step of ``step``."""

    def __init__(self, step: int | None):
        self.step = step

    def build_optimizer(self, model, knobs, **kwargs):
        opt = super().build_optimizer(model, knobs, **kwargs)
        steps = [0]

        def poison(optimizer, _args, _kwargs) -> None:
            if steps[0] == self.step:
                state = optimizer.state[model.get_parameter(TARGET)]["exp_avg_sq"]
                (state.to_local() if hasattr(state, "to_local") else state).view(-1)[0] = math.nan
            steps[0] += 1

        opt.register_step_post_hook(poison)
        return opt


def _rank(rank: int, size: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        mesh = _Mesh.build(CPU, size, PROBE)
        data = RankBatches(TokenBatches(synthetic_tokens(30_000, CFG.vocab_size, seed=0), seq_len=32, micro_batch=4,
                                        seed=0, eval_batches=1), mesh.dp_rank, mesh.dp_size)
        backend = _RankFault(2 if rank == 1 else None)  # only rank 1's shard goes bad
        result = run_probe(CFG, PROBE, Policy.bf16(None), data, backend, CPU, parallel=mesh.parallel(CPU))
        out[rank] = {"nonfinite": result.nonfinite, "steps": len(result.losses), "diverged": result.diverged}
    finally:
        dist.destroy_process_group()


def test_a_nan_in_one_ranks_shard_stops_every_rank_naming_it(tmp_path):
    """Rank 1's shard of a moment goes NaN after step 2: both ranks stop at step 2 and name it."""
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(2, str(tmp_path / "init"), out), nprocs=2)
    expected = {"step": 2, "tensor": f"{TARGET} exp_avg_sq", "state": None}
    assert dict(out) == {r: {"nonfinite": expected, "steps": 3, "diverged": True} for r in (0, 1)}, dict(out)
