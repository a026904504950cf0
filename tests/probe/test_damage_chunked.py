"""The chunked compare step of the fixed-state reading equals the whole-tensor one it replaced.

``_reference_read_state`` below is the compare step as it was before it streamed over chunks (2026-12-02),
written plainly: every unit's gradients, errors and updates whole, one AdamW update per batch through the
stored moments and the kept weight, pairwise float64 dot products. The new :func:`read_state` must give every
figure of every unit and of the total to 1e-9 (float64 Gram matrices may differ in the order of their sums),
with chunks small enough that each unit spans many of them and the last one is ragged; the updates themselves,
chunk by chunk, must be the whole tensor's to the bit.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.damage import DamageReader, gram
from precsearch.probe.damage.compare import compare_unit
from precsearch.probe.damage.reading import StateReading, _figures, _forward, read_state
from precsearch.probe.damage.update import MOMENTS, Storage, StepDtypes, UnitStep, applied_update, stored
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_reference as ref  # noqa: E402  (the compare step as it was: whole tensors, pairwise dots)

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
PROBE = ProbeSection(steps=8, micro_batch=4, seq_len=32, lr=3e-3, lr_warmup_steps=2, device="cpu")
SETTINGS = DamageSection(states=[0.0, 1.0], batches=4, tokens_per_step=4096)
CPU = torch.device("cpu")


# ---- the reference: the compare step before chunking, whole tensors, one update per batch ----------------------

_ref_stored, _ref_adam, _ref_keep, _ref_applied, _ref_gram = ref.stored, ref.adam, ref.keep, ref.applied, ref.pairwise_gram


def _ref_unit_grams(g, p, weight, moments, knobs, param_dtype, args):
    g = [t.float() for t in g]
    p = [t.float() for t in p]
    e = [pk - gk for pk, gk in zip(p, g)]
    if moments is None:
        moments = (torch.zeros_like(weight), torch.zeros_like(weight))
    baseline = [_ref_adam(weight, gk, *moments, *args) for gk in g]
    pol = [_ref_applied(weight, pk, moments, *args, knobs, param_dtype) for pk in p]
    ue = [a - b for a, b in zip(pol, baseline)]
    return {"g": _ref_gram(g), "e": _ref_gram(e), "u": _ref_gram(baseline), "ue": _ref_gram(ue)}


def _reference_read_state(bf16, pol, state, policy, probe, settings) -> StateReading:
    r = settings.tokens_per_step / (probe.micro_batch * probe.seq_len)
    args = (state.step, state.lr, probe.betas, probe.weight_decay)
    grams = {unit: _ref_unit_grams([b[unit] for b in bf16.grads], [b[unit] for b in pol.grads],
                                   state.weights[f"{unit}.weight"], state.moments.get(unit), policy.memory,
                                   probe.param_dtype, args)
             for unit in bf16.grads[0]}
    total = {key: sum(gm[key] for gm in grams.values()) for key in ("g", "e", "u", "ue")}
    reading = StateReading(step=state.step, total=_figures(total, r) | {"forward": _forward(bf16, pol)})
    reading.units = {unit: _figures(gm, r) for unit, gm in grams.items()}
    return reading


# ---- comparisons ----------------------------------------------------------------------------------------------

def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


def _assert_same_reading(new: StateReading, old: StateReading) -> int:
    """Every figure (value and standard error) of the total and of every unit within 1e-9; returns how many
    figures were finite and nonzero (so that a comparison of zeros alone is noticed)."""
    assert new.step == old.step and set(new.units) == set(old.units)
    compared = 0
    for where, a, b in [("total", new.total, old.total)] + [(u, new.units[u], old.units[u]) for u in old.units]:
        assert set(a) == set(b), where
        for figure in b:
            for x, y, part in zip(a[figure], b[figure], ("value", "se")):
                assert _close(x, y), (where, figure, part, x, y)
                compared += math.isfinite(y) and y != 0
    return compared


def _assert_same_gram(new: torch.Tensor, old: torch.Tensor) -> None:
    """Entry by entry within 1e-9 of the Cauchy-Schwarz bound sqrt(M_ii M_jj) (summation order only)."""
    assert new.dtype == torch.float64 and new.device.type == "cpu"
    assert torch.allclose(new, new.T, rtol=0, atol=0, equal_nan=True)  # exactly symmetric
    d = old.diagonal().clamp(min=0).sqrt()
    bound = 1e-9 * torch.outer(d, d) + 1e-300
    nan = old.isnan()
    assert torch.equal(nan, new.isnan())
    assert bool(((new - old).abs()[~nan] <= bound[~nan]).all()), (new, old)


def _fp8(memory: MemoryKnobs = MemoryKnobs()) -> Policy:
    return Policy(rules=(Rule(name="all", modules=("*",), precision=Precision.FP8_CURRENT),), memory=memory)


POLICIES = {
    "plain FP8": (_fp8(), "fp32"),
    "BF16 moments": (_fp8(MemoryKnobs(moment_dtype="bf16", master_weights=True)), "fp32"),
    "FP8 moments": (_fp8(MemoryKnobs(moment_dtype="fp8", master_weights=True)), "fp32"),
    "mixed moments": (_fp8(MemoryKnobs(master_weights=True, exp_avg_dtype="fp8", exp_avg_sq_dtype="bf16")), "fp32"),
    "no master (BF16 params)": (_fp8(), "bf16"),
    "FP16 master": (_fp8(MemoryKnobs(master_weights=True, master_dtype="fp16")), "bf16"),
    "FP16 master, FP8 moments": (_fp8(MemoryKnobs(master_weights=True, master_dtype="fp16", moment_dtype="fp8")),
                                 "bf16"),
    "param remainders": (_fp8(MemoryKnobs(master_weights=True, master_dtype="remainders")), "bf16"),
}


@pytest.fixture(scope="module")
def readers() -> dict[str, DamageReader]:
    """One reader per parameter dtype, each with its states and BF16 sides computed once."""
    data = TokenBatches(synthetic_tokens(30_000, CFG.vocab_size, seed=0), seq_len=32, micro_batch=4, seed=0,
                        eval_batches=2)
    out = {}
    for dtype in ("fp32", "bf16"):
        probe = PROBE.model_copy(update={"param_dtype": dtype})
        out[dtype] = DamageReader(CFG, probe, data, EmulatedBackend(), CPU, SETTINGS)
        out[dtype].bf16_sides(None)
    return out


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_chunked_reading_equals_the_whole_tensor_one(readers, name):
    """Every figure at both states (step 0: no moments yet; the end), each unit spanning tens of chunks of
    100 elements (the last one ragged), against the reference; and the one-chunk reading equals it too."""
    policy, param_dtype = POLICIES[name]
    reader = readers[param_dtype]
    compared = 0
    for state, bf16 in reader.bf16_sides(None):
        side = reader._side(state, policy)
        old = _reference_read_state(bf16, side, state, policy, reader.probe, reader.settings)
        compared += _assert_same_reading(read_state(bf16, side, state, policy, reader.probe, reader.settings, CPU,
                                                    chunk=100), old)
        if state.step > 0:
            _assert_same_reading(read_state(bf16, side, state, policy, reader.probe, reader.settings, CPU), old)
    assert compared > 100  # the policies all read off zero (FP8 compute), in the gradient and the update figures


# ---- one unit, random tensors: every storage combination, chunks of 7 -----------------------------------------

def _unit(seed: int, shape=(9, 13), k: int = 4, grad_dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(shape, generator=gen) * 0.05
    weight.view(-1)[101] = 0.9  # the weight's amax in a middle chunk (of 7: elements 98..104)
    moments = (torch.randn(shape, generator=gen) * 1e-3, torch.rand(shape, generator=gen) * 1e-6)
    moments[0].view(-1)[17] = 5e-3
    g = [torch.randn(shape, generator=gen).to(grad_dtype) for _ in range(k)]
    p = [(gk.float() + 0.01 * torch.randn(shape, generator=gen)).to(grad_dtype) for gk in g]
    return weight, moments, g, p


KNOBS = [MemoryKnobs(), MemoryKnobs(master_weights=True), MemoryKnobs(moment_dtype="bf16", master_weights=True),
         MemoryKnobs(moment_dtype="fp8", master_weights=True),
         MemoryKnobs(master_weights=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="fp8"),
         MemoryKnobs(master_weights=True, master_dtype="fp16"),
         MemoryKnobs(master_weights=True, master_dtype="fp16", moment_dtype="fp8"),
         MemoryKnobs(master_weights=True, master_dtype="remainders", moment_dtype="bf16"),
         MemoryKnobs(fp8_weights=True, moment_dtype="bf16"), MemoryKnobs(moment_dtype="fp8")]
ARGS = (5, 3e-2, (0.9, 0.95), 0.1)  # a large lr: BF16 and FP16 storage keep part of each update, lose part


def _chunked_applied(weight, moments, p, knobs, param_dtype, chunk):
    """The policy's applied updates for the stacked batches ``p``, computed chunk by chunk with :class:`UnitStep`
    (amaxes over chunks, as :func:`compare_unit` takes them), concatenated back."""
    dtypes = StepDtypes.of(knobs, param_dtype)
    w = weight.reshape(-1)
    m = tuple(x.reshape(-1) for x in moments)
    rows = torch.stack([x.float().reshape(-1) for x in p])
    spans = [slice(s, min(s + chunk, w.numel())) for s in range(0, w.numel(), chunk)]
    named = {"weight": w, **dict(zip(MOMENTS, m))}
    amax = {n: torch.stack([named[n][s].abs().max() for s in spans]).max() for n in dtypes.scaled()}
    step = UnitStep(dtypes, ARGS, amax)
    landed = None
    if dtypes.keep in ("fp16", "fp8"):
        landed = Storage(dtypes.keep, torch.cat([step.landed_amax(w[s], rows[:, s], tuple(x[s] for x in m))
                                                 for s in spans], dim=1).amax(dim=1, keepdim=True))
    return torch.cat([step.applied(w[s], rows[:, s], tuple(x[s] for x in m), landed) for s in spans], dim=1)


@pytest.mark.parametrize("param_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(k.changed()) or "default")
def test_chunked_updates_are_the_whole_tensors_to_the_bit(knobs, param_dtype):
    """Chunks of 7 of a 117-element unit (the last one 5 long): each batch's applied update, and the
    re-expressed :func:`applied_update`, equal the reference's bit for bit, for every storage of the moments
    and of the kept weight (FP16's and FP8's per-tensor scales from the whole tensor, FP16's landing scale
    from each batch's whole sum)."""
    weight, moments, _, p = _unit(0)
    chunked = _chunked_applied(weight, moments, p, knobs, param_dtype, 7)
    for k, pk in enumerate(p):
        expected = _ref_applied(weight, pk, moments, *ARGS, knobs, param_dtype)
        assert torch.equal(chunked[k].view_as(weight), expected), k
        assert torch.equal(applied_update(weight, pk, moments, *ARGS, knobs, param_dtype), expected), k
    if _ref_keep(knobs, param_dtype) != "fp32":  # the storage kept part of each update and lost part
        first, second = knobs.moment_dtypes(param_dtype)
        update = _ref_adam(weight, p[0].float(), _ref_stored(moments[0], first), _ref_stored(moments[1], second),
                           *ARGS)
        assert not torch.equal(chunked[0].view_as(weight), update) and bool(chunked[0].ne(0).any())


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp8"])
def test_a_storage_applied_by_chunks_is_the_whole_tensors(dtype):
    x = torch.randn(100, generator=torch.Generator().manual_seed(3))
    x[57] = 40.0
    whole = Storage.of(x, dtype)
    assert torch.equal(torch.cat([whole(x[s:s + 7]) for s in range(0, 100, 7)]), _ref_stored(x, dtype))
    assert torch.equal(stored(x, dtype), _ref_stored(x, dtype))
    with pytest.raises(ValueError, match="unknown storage dtype"):
        stored(x, "fp4")


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(k.changed()) or "default")
@pytest.mark.parametrize("chunk", [7, 50, 117, 10_000])
def test_a_units_grams_equal_the_pairwise_ones(knobs, chunk):
    """:func:`compare_unit`'s four Gram matrices against the reference's, for BF16 parameters (every keep: BF16,
    FP16, FP32), BF16 gradients, at a state with moments and one without (zero moments, which scaled storage
    keeps as zeros)."""
    weight, moments, g, p = _unit(1, grad_dtype=torch.bfloat16)
    dtypes = StepDtypes.of(knobs, "bf16")
    for m in (moments, None):
        new = compare_unit(g, p, weight, m, dtypes, ARGS, CPU, chunk)
        old = _ref_unit_grams(g, p, weight, m, knobs, "bf16", ARGS)
        assert set(new) == set(old)
        for key in old:
            _assert_same_gram(new[key], old[key])
        assert float(new["e"].trace()) > 0 and float(new["u"].trace()) > 0


def test_gram_of_stays_the_pairwise_gram():
    """``gram_of`` (chunked, on top of ``gram_of_stacked``) against pairwise float64 dots, ragged chunks."""
    gen = torch.Generator().manual_seed(2)
    vectors = [torch.randn(5, 61, generator=gen) + 0.3 for _ in range(6)]
    for chunk in (7, 305, 1000):
        _assert_same_gram(gram.gram_of(vectors, chunk=chunk), _ref_gram(vectors))
    weight = torch.rand(5, 61, generator=gen)
    _assert_same_gram(gram.gram_of(vectors, weight, chunk=7), _ref_gram([v * weight for v in vectors]))
    assert gram.gram_of([]).shape == (0, 0)


@pytest.mark.parametrize("dtype", ["fp16", "fp8"])
def test_zeros_are_stored_as_zeros_not_nan(dtype):
    """Moments before the first step are zeros; a scale of 1 / 0 made them NaN and every update figure with them."""
    zeros = torch.zeros(3, 5)
    assert torch.equal(stored(zeros, dtype), zeros)
    tiny = torch.full((4,), torch.finfo(torch.float32).tiny)
    assert torch.isfinite(stored(tiny, dtype)).all()
