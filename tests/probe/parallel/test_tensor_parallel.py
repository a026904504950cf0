"""Tensor parallelism on CPU processes (gloo): the split probe against the whole one.

Two kinds of test:

* **Exact gradients** (``torch.multiprocessing`` ranks, float32, no autocast): every rank's slice of
  every gradient, after :func:`sum_partial_grads`, must equal the same slice of the whole model's
  gradient (the vocabulary-parallel embedding, output layer and loss included), the loss the whole
  model's loss, and :func:`clip_grad_norm` the whole model's norm. Only summation order differs
  (float32: 1e-5). Leaving out the partial-gradient sum, splitting fc1's gate and up rows as one
  block, or a wrong collective changes some gradient by O(1).
* **The probe** (torchrun, the emulated backend, BF16 autocast): a TP=2 probe's loss curve against
  the one-process probe's, and TP=2 x FSDP2=2 on four processes.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from _spaces import tiny_space_dict
from precsearch.arch.config import PRESETS
from precsearch.backends import get_backend
from precsearch.config.checks import check_nproc
from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.policy import Policy
from precsearch.probe.data import load_batches
from precsearch.probe.parallel.distributed import run_distributed_probe
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.model.llama3 import build_model
from precsearch.probe.memory.rank_peak import predict_rank_peak
from precsearch.probe.runner import backend_precisions, run_probe
from precsearch.probe.parallel.tensor_parallel import (PARTIAL_GRAD, SPLIT, TensorParallel, clip_grad_norm, split_model,
                                              sum_partial_grads)
from precsearch.search.sampling import policy_from_params

CPU = torch.device("cpu")
#: 4 query heads in 2 KV groups: TP 2 gives each rank one whole group.
CFG = dataclasses.replace(PRESETS["tiny"], dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96, n_layers=2, vocab_size=98)


def _slice_of(whole: torch.Tensor, name: str, rank: int, size: int) -> torch.Tensor:
    """The rank's slice of a whole-model tensor, cut the way split_model cuts the weights."""
    if name.endswith(("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
        return whole.chunk(size, 0)[rank]
    if name.endswith("linear_fc1.weight"):
        gate, up = whole.chunk(2, 0)
        return torch.cat([gate.chunk(size, 0)[rank], up.chunk(size, 0)[rank]])
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return whole.chunk(size, 1)[rank]
    return whole


def _rank_gradients(rank: int, size: int, sequence_parallel: bool, init_file: str, sum_partials: bool,
                    out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        torch.manual_seed(0)
        ids = torch.randint(0, CFG.vocab_size, (2, 8))
        targets = torch.randint(0, CFG.vocab_size, (2, 8))
        targets[0, :3] = -100  # ignored positions, as padding
        whole = build_model(CFG, seed=3)
        whole(ids, targets).backward()
        model = build_model(CFG, seed=3)
        tp = TensorParallel(dist.group.WORLD, size, rank, sequence_parallel)
        split_model(model, tp)
        loss = model(ids, targets)
        loss.backward()
        if sum_partials:
            sum_partial_grads(model, tp)
        norm = clip_grad_norm(model, math.inf, tp)
        wholes = dict(whole.named_parameters())
        worst = {name: float((p.grad - _slice_of(wholes[name].grad, name, rank, size)).abs().max()
                             / _slice_of(wholes[name].grad, name, rank, size).abs().max())
                 for name, p in model.named_parameters()}
        whole_norm = torch.nn.utils.clip_grad_norm_(whole.parameters(), math.inf)
        logits = (model(ids), whole(ids))  # the gathered vocabulary against the whole model's logits
        out[rank] = {"loss": (float(loss), float(whole(ids, targets))), "worst": worst,
                     "logits": float((logits[0] - logits[1]).abs().max()),
                     "norm": (float(norm), float(whole_norm)),
                     "split": sorted(n for n, p in model.named_parameters() if getattr(p, SPLIT, False)),
                     "partial": sorted(n for n, p in model.named_parameters() if getattr(p, PARTIAL_GRAD, False))}
    finally:
        dist.destroy_process_group()


def _spawn_gradients(tmp_path, sequence_parallel: bool, sum_partials: bool = True) -> dict:
    out = mp.Manager().dict()
    mp.spawn(_rank_gradients, args=(2, sequence_parallel, str(tmp_path / "init"), sum_partials, out), nprocs=2)
    return dict(out)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_every_gradient_slice_matches_the_whole_model(tmp_path, sequence_parallel):
    results = _spawn_gradients(tmp_path, sequence_parallel)
    for rank, r in results.items():
        assert abs(r["loss"][0] - r["loss"][1]) < 1e-5, f"rank {rank}: loss {r['loss']}"
        assert r["logits"] < 1e-5, f"rank {rank}: gathered logits off by {r['logits']}"
        bad = {n: w for n, w in r["worst"].items() if w > 1e-4}
        assert not bad, f"rank {rank} (SP {sequence_parallel}): gradients off the whole model's: {bad}"
        assert abs(r["norm"][0] - r["norm"][1]) / r["norm"][1] < 1e-5, f"rank {rank}: norm {r['norm']}"
        assert len(r["split"]) == 4 * CFG.n_layers + 2, r["split"]  # each block's 4 GEMMs, embedding, output
        expected_partial = 2 * CFG.n_layers + (1 if sequence_parallel else 0)  # fused norms (+ the final norm)
        assert len(r["partial"]) == expected_partial, r["partial"]


def test_without_the_partial_sum_the_norm_gradients_are_wrong(tmp_path):
    """The control: skipping sum_partial_grads leaves the fused norms' gradients at a share of the whole."""
    results = _spawn_gradients(tmp_path, sequence_parallel=True, sum_partials=False)
    worst = results[0]["worst"]
    assert max(w for n, w in worst.items() if "layer_norm_weight" in n) > 0.05, worst
    assert all(w < 1e-4 for n, w in worst.items() if n.endswith("linear_proj.weight")), worst


def _space(**overrides) -> Space:
    return Space.model_validate(tiny_space_dict(**{"probe.nproc": 2, "probe.tp": 2, **overrides}))


def _one_process(space: Space, policy: Policy):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs
    try:
        return run_probe(space.model.probe(), space.probe, policy, load_batches(space),
                         get_backend("emulated", CPU), CPU)
    finally:
        torch.set_num_threads(threads)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("attention, sequence_parallel", [("fp8_delayed", True), ("fp8_current", False)])
def test_tp2_probe_trains_the_one_process_probe(attention, sequence_parallel):
    """TP=2 against one process, 6 steps of FP8 attention and BF16 MLPs (the emulated backend).

    Tolerances, from runs of this test: delayed scaling reduces its amax over the ranks, so both
    quantize with the whole tensor's scale and only BF16 partial sums differ (first loss 2e-5,
    curve 3e-4); current scaling quantizes each rank's weight slice with its own scale, as TE
    does (first loss 9e-4, curve 1e-3). Held to 2e-3 / 5e-3. A TP group that trained different
    rows, or a row-parallel output not summed, moves the first loss by over 1e-2.
    """
    space = _space(**{"probe.steps": 6, "probe.sequence_parallel": sequence_parallel})
    policy = policy_from_params(space, {"precision.attention": attention, "precision.mlp": "bf16",
                                        "warmup_steps": 0})
    two = run_distributed_probe(space, space.probe, policy, f"TP 2, {attention}")
    one = _one_process(space, policy)
    assert two.device == f"2 x cpu (TP 2{' + SP' if sequence_parallel else ''})"
    assert len(two.losses) == 6 and all(math.isfinite(x) for x in two.losses + two.grad_norms)
    assert _rel(two.losses[0], one.losses[0]) < 2e-3, (two.losses, one.losses)
    assert max(_rel(a, b) for a, b in zip(two.losses, one.losses)) < 5e-3, (two.losses, one.losses)
    assert max(_rel(a, b) for a, b in zip(two.grad_norms, one.grad_norms)) < 0.1, (two.grad_norms, one.grad_norms)
    assert _rel(two.eval_loss, one.eval_loss) < 5e-3
    assert two.per_rank_peak_bytes == [predict_rank_peak(space.model.probe(), space.probe, policy).total] * 2
    # what a trial's memory is "saved from" is the target's per-rank breakdown, not the one-process model's
    assert two.target_breakdown == predict_rank_peak(space.model.target(), space.probe, policy).components()


def test_tp2_by_fsdp2_on_four_processes():
    """Two data-parallel groups of two TP ranks: each group trains half the batch, FSDP2 shards over them."""
    space = _space(**{"probe.nproc": 4, "probe.steps": 4})
    policy = policy_from_params(space, {"precision.attention": "fp8_delayed", "precision.mlp": "bf16",
                                        "warmup_steps": 0})
    four = run_distributed_probe(space, space.probe, policy, "TP 2 x FSDP2 2")
    one = _one_process(space, policy)
    assert four.device == "4 x cpu (TP 2 + SP x FSDP2 2)"
    assert _rel(four.losses[0], one.losses[0]) < 2e-3, (four.losses, one.losses)
    assert max(_rel(a, b) for a, b in zip(four.losses, one.losses)) < 5e-3, (four.losses, one.losses)


# -- the space checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, field, words", [
    ({"probe.nproc": 2, "probe.tp": 4}, "probe.tp", "does not divide nproc"),
    ({"probe.nproc": 4, "probe.tp": 4, "model.n_kv_heads": 2}, "probe.tp", "n_kv_heads"),
    ({"probe.nproc": 2, "probe.tp": 2, "probe.seq_len": 33}, "probe.seq_len", "sequence parallelism"),
    ({"probe.nproc": 2, "probe.tp": 2, "model.vocab_size": 255}, "probe.tp", "vocab_size"),
    ({"probe.nproc": 4, "probe.tp": 2, "probe.micro_batch": 3}, "probe.nproc", "2 data-parallel groups"),
])
def test_tp_space_errors_name_the_field(overrides, field, words):
    space = Space.model_validate(tiny_space_dict(**overrides))
    with pytest.raises(UserError) as info:
        check_nproc(space)
    assert info.value.field == field and words in str(info.value), str(info.value)


def test_odd_sequence_is_fine_without_sequence_parallelism():
    check_nproc(Space.model_validate(tiny_space_dict(**{"probe.nproc": 2, "probe.tp": 2, "probe.seq_len": 33,
                                                       "probe.sequence_parallel": False})))


# -- the per-rank memory model ------------------------------------------------------------------------


def test_rank_memory_splits_block_state_and_activations():
    """Against a count written here: block GEMM state / tp, everything else whole; SP halves the norms too."""
    space = _space(**{"probe.micro_batch": 2})
    cfg, policy = space.model.probe(), Policy()
    precisions = backend_precisions(policy, cfg)
    whole = predict_peak(cfg, precisions, seq_len=space.probe.seq_len, micro_batch=2, param_dtype="fp32")
    gemms = cfg.n_layers * (cfg.dim * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.dim * cfg.dim
                            + 3 * cfg.dim * cfg.ffn_dim)
    split = gemms + 2 * cfg.vocab_size * cfg.dim  # and the embedding and output layer (the vocabulary)
    rank = predict_rank_peak(cfg, space.probe, policy)
    assert rank.params == math.ceil(4 * (cfg.num_params() - split / 2))
    assert rank.grads == rank.params and rank.logits == whole.logits // 2
    no_sp = predict_rank_peak(cfg, space.probe.model_copy(update={"sequence_parallel": False}), policy)
    tokens = space.probe.seq_len * 2
    norms = tokens * (2 * cfg.n_layers + 1) * (cfg.dim * 8 + 4)  # fp32 input + fp32 residual output + 1/rms
    inputs = tokens * cfg.n_layers * 2 * cfg.dim * 2  # qkv and fc1 read the BF16-cast residual stream
    assert no_sp.other_activations - rank.other_activations == norms // 2
    assert no_sp.linear_inputs - rank.linear_inputs == inputs // 2


# -- delayed scales over the TP group (Megatron-LM #442) ------------------------------------------------


def _rank_delayed_scales(rank: int, size: int, init_file: str, reduce_amax: bool, out: dict) -> None:
    from precsearch.arch.units import unit_names
    from precsearch.precision import LayerRecipe, Precision
    from precsearch.probe.parallel.distributed_rank import _reduce_delayed_amax

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        torch.manual_seed(0)
        ids = torch.randint(0, CFG.vocab_size, (2, 8))
        model = build_model(CFG, seed=3)
        split_model(model, TensorParallel(dist.group.WORLD, size, rank, True))
        backend = get_backend("emulated", CPU)
        backend.convert(model, {n: LayerRecipe(Precision.FP8_DELAYED) for n in unit_names(CFG)})
        if reduce_amax:
            _reduce_delayed_amax(model)
        for _ in range(2):  # the second step quantizes with scales from the first step's amaxes
            with backend.autocast(model, enabled=True):
                model(ids, ids).backward()
        layers = {n: m for n, m in model.named_modules() if hasattr(m, "weight_scaler")}
        mine = torch.stack([getattr(m, role).scale.float() for m in layers.values()
                            for role in ("input_scaler", "weight_scaler", "grad_output_scaler")])
        every = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(every, mine)
        out[rank] = float(((every[0] - every[1]).abs() / every[0]).max())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("reduce_amax", [True, False])
def test_delayed_scales_are_one_over_the_tp_group(tmp_path, reduce_amax):
    """The probe reduces delayed amaxes over every rank, so the TP ranks quantize each split tensor with one
    scale; the control (each rank's own amax, the #442 mistake) gives them different scales."""
    out = mp.Manager().dict()
    mp.spawn(_rank_delayed_scales, args=(2, str(tmp_path / "init"), reduce_amax, out), nprocs=2)
    if reduce_amax:
        assert out[0] == 0.0, f"TP ranks' delayed scales differ by up to {out[0]:.2e}"
    else:
        assert out[0] > 1e-3, "the control should give the ranks' weight slices different scales"
