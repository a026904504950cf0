"""The compare step's two savings keep the figures: the BF16 side's Gram matrices computed once per state, and
the chunk's elementwise step compiled (``torch.compile``, as CUDA runs it; here on the CPU's inductor).

What would be wrong if these failed:
* the reader's kept ``g`` / ``u`` matrices are not those a full compare computes (a state's step or learning
  rate, or the baseline's storages, differ between the two), so every trial after the first reads wrong;
* the compiled chunk computes another step than the op-by-op one (a storage or a scalar traced as a
  constant of the first call, a family in the wrong rows), or it recompiles for each state of a study;
* a failing compile stops the study instead of falling back to the same math op by op.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from precsearch.policy import MemoryKnobs
from precsearch.probe.damage import compare
from precsearch.probe.damage.compare import (BASE, GRAMS, POLICY, StateSlices, baseline_grams, chunk_rows,
                                             compare_unit)
from precsearch.probe.damage.update import StepDtypes

CPU = torch.device("cpu")
ARGS = (5, 3e-2, (0.9, 0.95), 0.1)


def _unit(seed: int, shape=(37, 29), k: int = 4):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(shape, generator=gen) * 0.05
    moments = (torch.randn(shape, generator=gen) * 1e-3, torch.rand(shape, generator=gen) * 1e-6)
    g = [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(k)]
    p = [(gk.float() + 0.01 * torch.randn(shape, generator=gen)).to(torch.bfloat16) for gk in g]
    return weight, moments, g, p


@pytest.mark.parametrize("knobs", [MemoryKnobs(), MemoryKnobs(moment_dtype="bf16", master_weights=True),
                                   MemoryKnobs(master_weights=True, master_dtype="fp16")],
                         ids=["default", "bf16 moments", "fp16 master"])
def test_kept_bf16_grams_are_the_full_compares(knobs):
    """``baseline_grams`` once, then ``compare_unit(base=...)``, equals the four-family compare exactly in
    ``g`` and ``u`` and to summation order in ``e`` and ``ue``; at a state with moments and one without."""
    weight, moments, g, p = _unit(1)
    dtypes = StepDtypes.of(knobs, "bf16")
    for m in (moments, None):
        full = compare_unit(g, p, weight, m, dtypes, ARGS, CPU, 100)
        base = baseline_grams(g, weight, m, ARGS, CPU, 100)
        assert set(base) == set(BASE)
        split = compare_unit(g, p, weight, m, dtypes, ARGS, CPU, 100, base=base)
        assert set(split) == set(GRAMS)
        for key in GRAMS:
            assert torch.allclose(split[key], full[key], rtol=1e-12, atol=0), key
        assert float(split["ue"].trace()) > 0 and float(split["e"].trace()) > 0


def test_a_policy_compare_builds_only_its_two_families(monkeypatch):
    """With the BF16 matrices given, each chunk's block holds 2K rows (``e``, ``ue``), not 4K."""
    weight, moments, g, p = _unit(2)
    base = baseline_grams(g, weight, moments, ARGS, CPU, 300)
    seen = []

    def spy(*args):
        seen.append(args[-1])
        return chunk_rows(*args)

    monkeypatch.setattr(compare, "rows_for", lambda device, enabled=True: spy)
    compare_unit(g, p, weight, moments, StepDtypes.of(MemoryKnobs(), "bf16"), ARGS, CPU, 300, base=base)
    assert seen and all(families == POLICY for families in seen)
    assert len(seen) == math.ceil(weight.numel() / 300)


def test_chunk_rows_stacks_the_families_in_order():
    weight, moments, g, p = _unit(3, shape=(50,))
    rows = chunk_rows(g, p, weight, *moments, StepDtypes("fp32", "fp32", "fp32"), {}, None, 5, 3e-2, 0.9, 0.95,
                      0.1, ("e", "g"))
    assert rows.dtype == torch.float64 and rows.shape == (8, 50)
    assert torch.equal(rows[:4], torch.stack(p).double() - torch.stack(g).double())  # exact: BF16 in float32
    assert torch.equal(rows[4:], torch.stack(g).double())


def _figures_close(a: dict, b: dict, rel: float) -> None:
    for key in GRAMS:
        scale = b[key].diagonal().abs().max()
        assert float((a[key] - b[key]).abs().max()) <= rel * float(scale), key


def test_the_compiled_chunk_is_the_op_by_op_one_across_states_and_sizes(monkeypatch):
    """``torch.compile(chunk_rows, dynamic=True)`` with :data:`compare.COMPILE_OPTIONS` (inductor on the CPU here; CUDA's kernels are
    tests/backends/test_gpu_damage.py's) gives the op-by-op Gram matrices to float32 rounding, for two states
    (other step, learning rate) and a ragged last chunk, with no compile for the second state; FP8 moments too."""
    torch._dynamo.reset()
    compiles = []

    def counting_backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx
        compiles.append(len(example_inputs))
        return compile_fx(gm, example_inputs, config_patches=compare.COMPILE_OPTIONS)

    fused = torch.compile(chunk_rows, backend=counting_backend, dynamic=True)
    weight, moments, g, p = _unit(4, shape=(61, 33))  # 2013 elements: chunks of 500, the last one 13 long
    bf16 = StepDtypes.of(MemoryKnobs(moment_dtype="bf16", master_weights=True), "bf16")
    fp8 = StepDtypes.of(MemoryKnobs(moment_dtype="fp8", master_weights=True), "bf16")
    cases = [(bf16, ARGS), (bf16, (17, 1e-3, (0.9, 0.95), 0.1)), (fp8, ARGS)]
    want = [compare_unit(g, p, weight, moments, dtypes, args, CPU, 500) for dtypes, args in cases]
    monkeypatch.setattr(compare, "rows_for", lambda device, enabled=True: fused)
    got, seen = [], []
    for dtypes, args in cases:
        got.append(compare_unit(g, p, weight, moments, dtypes, args, CPU, 500))
        seen.append(len(compiles))
    for a, b in zip(got, want):
        _figures_close(a, b, 1e-5)
    assert 1 <= seen[0] <= 2 and seen[1] == seen[0], seen  # the second state: no new compile


def test_a_failing_compile_falls_back_to_the_same_math(monkeypatch, caplog):
    """On CUDA the compiled chunk is guarded: an exception from it (no compiler, an op inductor refuses) logs
    one warning and the rest of the process compares op by op, with the figures unchanged."""
    def broken(*args, **kwargs):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(compare, "compiled_rows", lambda device, enabled=True: broken)
    monkeypatch.setattr(compare, "_compiled", {})
    guarded = compare.rows_for(torch.device("cuda"))
    weight, moments, g, p = _unit(5, shape=(40,))
    args = (g, p, weight, *moments, StepDtypes("fp32", "fp32", "fp32"), {}, None, 5, 3e-2, 0.9, 0.95, 0.1, GRAMS)
    with caplog.at_level(logging.WARNING, logger=compare.__name__):
        first = guarded(*args)
        second = guarded(*args)
    assert torch.equal(first, chunk_rows(*args)) and torch.equal(second, first)
    assert isinstance(compare.compile_failure(), RuntimeError)
    assert sum("compiled compare step failed" in r.message for r in caplog.records) == 1


def test_on_a_cpu_nothing_is_compiled():
    assert compare.rows_for(CPU) is chunk_rows
    assert compare.rows_for(torch.device("cuda"), enabled=False) is chunk_rows


def test_state_slices_on_the_host_are_the_tensors_slices_and_zero_moments():
    weight, moments, _, _ = _unit(6, shape=(10,))
    spans = [slice(0, 4), slice(4, 10)]
    got = list(StateSlices(weight, moments, CPU)(spans))
    for (w, m0, m1), span in zip(got, spans):
        assert torch.equal(w, weight[span]) and torch.equal(m0, moments[0][span]) and torch.equal(m1, moments[1][span])
    (w, m0, m1), = StateSlices(weight, None, CPU)([slice(2, 5)])
    assert torch.equal(w, weight[2:5]) and not m0.any() and not m1.any() and m0.shape == (3,)
