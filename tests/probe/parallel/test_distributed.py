"""A probe on several processes (torchrun, FSDP2, gloo on CPU) against the one-process probe.

The launches here start real torchrun processes: two ranks of the emulated
backend on a 2-layer, 64-wide probe. Each launch costs a few seconds of
process start and imports.
"""

from __future__ import annotations

import math
import sys
import textwrap

import pytest
import torch
from pydantic import ValidationError

from _spaces import tiny_space_dict
from precsearch.backends import get_backend
from precsearch.config.checks import check_space
from precsearch.config.loader import load_space
from precsearch.config.space import ProbeSection, Space
from precsearch.errors import UserError
from precsearch.probe.parallel import distributed
from precsearch.probe.parallel.distributed import DistributedProbeError, run_distributed_probe
from precsearch.probe.parallel.distributed_rank import RankBatches, predict_rank_peak
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.runner import backend_precisions, run_probe
from precsearch.search.sampling import policy_from_params
from precsearch.probe.data import load_batches

CPU = torch.device("cpu")


def _space(**overrides) -> Space:
    return Space.model_validate(tiny_space_dict(**{"probe.nproc": 2, **overrides}))


def _bf16(space: Space):
    return policy_from_params(space, {"precision.attention": "bf16", "precision.mlp": "bf16", "warmup_steps": 0})


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_two_gloo_ranks_train_the_one_process_probe():
    """Two ranks splitting each batch must train the same probe as one process on the whole batch.

    The policy runs delayed-scaling FP8 attention (its amax is reduced over ranks)
    and BF16 MLPs. Tolerances: the first loss sees the same weights and rows, so
    only float summation order differs (< 1e-6). Later steps differ where BF16
    rounding happens: each rank rounds its weight gradient to BF16 before the
    FP32 reduction, one process rounds the whole batch's. Measured over 8-12
    steps: losses within 6e-4; gradient norms within 1e-3 with BF16 layers, but
    E5M2 gradients (2 mantissa bits) let single steps' norms jump by up to 7%
    under such tiny perturbations, so the median drift is held to 1e-2 and the
    worst to 0.25. A wrong split (ranks on the same rows) changes the first
    loss by ~1e-2; a gradient summed instead of averaged doubles every norm.
    """
    space = _space(**{"probe.steps": 8})
    policy = policy_from_params(space, {"precision.attention": "fp8_delayed", "precision.mlp": "bf16",
                                        "warmup_steps": 0})
    seen: list[int] = []
    two = run_distributed_probe(space, space.probe, policy, "two ranks", on_step=lambda s, l, g: seen.append(s))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs; more threads only fight on a busy 2-core machine
    try:
        one = run_probe(space.model.probe(), space.probe, policy, load_batches(space), get_backend("emulated", CPU),
                        CPU)
    finally:
        torch.set_num_threads(threads)

    assert seen == list(range(space.probe.steps)), "on_step must see every step rank 0 ran, in order"
    assert len(two.losses) == space.probe.steps and all(math.isfinite(x) for x in two.losses + two.grad_norms)
    assert _rel(two.losses[0], one.losses[0]) < 1e-6, "step 0 must see the same weights and the same rows"
    worst = max(_rel(a, b) for a, b in zip(two.losses, one.losses))
    assert worst < 2e-3, f"loss curve drifted {worst:.1e} from the one-process probe"
    norms = sorted(_rel(a, b) for a, b in zip(two.grad_norms, one.grad_norms))
    assert norms[len(norms) // 2] < 1e-2 and norms[-1] < 0.25, f"gradients not averaged: drifts {norms}"
    assert _rel(two.eval_loss, one.eval_loss) < 2e-3
    assert two.tokens_per_s > 0 and two.device == "2 x cpu (FSDP2)"
    assert two.memory_source == "predicted" and len(two.per_rank_peak_bytes) == 2
    assert two.peak_memory_bytes == max(two.per_rank_peak_bytes) == predict_rank_peak(
        space.model.probe(), space.probe, policy).total


_FAILING_WORKER = """
    import os, signal, time
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if os.environ["RANK"] == "1":
            if os.environ["HOW"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            print("rank 1 is about to fail", file=__import__("sys").stderr, flush=True)
            raise ValueError("rank one cannot build its probe")
        time.sleep(60)  # rank 0 waits, as it would in a collective

    main()
"""


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_rank_is_named(tmp_path, monkeypatch, how):
    """A rank that raises (or is killed) must fail the probe with an error naming that rank.

    Without it a multi-GPU trial would fail as "exit status 1" with no clue which
    process broke or why; rank 0, left waiting, must not hang the caller either.
    """
    (tmp_path / "failing_worker.py").write_text(textwrap.dedent(_FAILING_WORKER))
    monkeypatch.setattr(distributed, "_WORKER", "failing_worker")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("HOW", how)
    space = _space()
    with pytest.raises(DistributedProbeError, match="failed on rank 1 of 2") as caught:
        run_distributed_probe(space, space.probe, _bf16(space), "trial 7", timeout=50)
    assert caught.value.rank == 1
    if how == "raise":
        assert "ValueError: rank one cannot build its probe" in str(caught.value)
        assert "rank 1 is about to fail" in caught.value.stderr_tail
    else:
        assert "SIGKILL" in str(caught.value) or "Signal 9" in str(caught.value)


def test_a_probe_past_its_timeout_is_stopped(tmp_path, monkeypatch):
    """A launch that outlives ``timeout`` must be killed and reported, not waited on forever."""
    (tmp_path / "failing_worker.py").write_text(textwrap.dedent(_FAILING_WORKER).replace('"1"', '"none"'))
    monkeypatch.setattr(distributed, "_WORKER", "failing_worker")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("HOW", "raise")
    space = _space()
    with pytest.raises(DistributedProbeError, match="did not finish within 3 s"):
        run_distributed_probe(space, space.probe, _bf16(space), "slow", timeout=3)


def test_nproc_is_validated():
    """A bad nproc must be refused up front, naming probe.nproc, before any process starts."""
    with pytest.raises(ValidationError, match="nproc"):
        ProbeSection(nproc=0)
    with pytest.raises(UserError, match="probe.nproc: nproc 3 does not divide micro_batch 4"):
        check_space(_space(**{"probe.nproc": 3}), file="space.yaml")
    knobs = _space(**{"search.memory": {"master_weights": {"choices": [False, True]}}})
    with pytest.raises(UserError, match="search.memory.master_weights"):
        check_space(knobs, file="space.yaml")
    with pytest.raises(UserError, match="probe.nproc"):
        run_distributed_probe(_space(**{"probe.nproc": 3}), _space(**{"probe.nproc": 3}).probe,
                              _bf16(_space()), "x")


def test_nproc_beyond_the_visible_gpus_is_refused(monkeypatch):
    """On a GPU, nproc counts GPUs: asking for more than are visible must say how many there are."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match="probe.nproc: nproc 2 needs 2 GPUs .* but 1 visible; valid: 1 to 1"):
        distributed.check_gpus(_space(**{"probe.device": "cuda"}))


def test_rank_batches_split_every_batch_evenly():
    """Ranks' rows, put back together, must be exactly the one-process batch (train and held-out)."""
    data = load_batches(_space())
    ranks = [RankBatches(data, r, 2) for r in range(2)]
    full_inputs, full_targets = data.train_batch(5)
    parts = [r.train_batch(5) for r in ranks]
    assert torch.equal(torch.cat([p[0] for p in parts]), full_inputs)
    assert torch.equal(torch.cat([p[1] for p in parts]), full_targets)
    for i, (inputs, _) in enumerate(data.eval_set()):
        assert torch.equal(torch.cat([r.eval_set()[i][0] for r in ranks]), inputs)


def test_a_rank_predicts_its_share_of_the_70b_probe():
    """Sharding over 2 GPUs must halve the training state and activations, not the gathered weights.

    If the per-rank figure were the one-process one, a 70B-shaped probe would look
    twice as big as it is; if everything were halved, it would look too small.
    """
    space = load_space(__import__("pathlib").Path(__file__).parents[3] / "search_spaces/llama3_70b_h200x2.yaml")
    cfg, probe = space.model.probe(), space.probe
    policy = policy_from_params(space, {"precision.attention": "bf16", "precision.mlp": "bf16", "warmup_steps": 0})
    one = predict_peak(cfg, backend_precisions(policy, cfg), seq_len=probe.seq_len, micro_batch=probe.micro_batch,
                       param_dtype=probe.param_dtype, memory=policy.memory)
    rank = predict_rank_peak(cfg, probe, policy)
    assert rank.optimizer == one.optimizer // 2 and rank.grads == one.grads // 2
    assert rank.logits == one.logits // 2
    assert one.total / 2 < rank.total < one.total
    assert rank.total < 139 * 2**30, "the shipped 2 x H200 space must fit one H200 per rank"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_study_with_nproc_2_runs_its_probes_through_torchrun(tmp_path):
    """`precsearch run` on a space with probe.nproc 2: the reference and the trial are 2-rank probes."""
    import optuna

    from _spaces import write_space
    from precsearch.cli import main

    space = write_space(tmp_path, tiny_space_dict(**{"probe.nproc": 2, "probe.steps": 6, "study.n_trials": 1,
                                                     "objectives.reference_seeds": 1}))
    assert main(["run", str(space), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 0
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'out' / 'optuna.db'}")
    (trial,) = study.trials
    result = trial.user_attrs["probe_result"]
    assert len(result["per_rank_peak_bytes"]) == 2 and "FSDP2" in result["device"]
    assert trial.state.name == "COMPLETE" and len(result["losses"]) == 6
    # the target's memory is predicted per GPU for the target sharded the same way (uncalibrated on CPU)
    loaded = Space.model_validate(study.user_attrs["space"])
    policy = policy_from_params(loaded, trial.params)
    expected = predict_rank_peak(loaded.model.target(), loaded.probe, policy).total
    assert result["target_memory_bytes"] == expected and result["target_layers"] == loaded.model.target().n_layers
