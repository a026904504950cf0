"""The fixed-state damage reading on Transformer Engine's modules (GPU only; the H200 via the device tool).

What would be wrong if these failed:
* a BF16 policy reads more than a sliver of FP8's reading: the two sides do not compute on the same weights
  and batches (a conversion that loses the state's weights, or a unit whose gradient is looked up wrongly);
* a fused ``LayerNormMLP`` (fc1 and fc2 of one recipe) and split units read differently from each other by
  orders of magnitude: ``Backend.unit_weight`` finds the wrong Parameter for a fused unit;
* TE's FP8 current scaling reads orders of magnitude away from the emulated one: one of them is not
  quantizing what the other is;
* the compiled compare step (CUDA's inductor kernels) computes another step than the op-by-op one, fails to
  compile here (the reading would fall back, slower), or a host-kept state's side-stream copies race the
  compute.
"""

from __future__ import annotations

import pytest
import torch
from _floats import differing, every_exponent

from precsearch.backends import get_backend
from precsearch.backends.capability import te_import_error
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.damage import DamageReader, compare
from precsearch.probe.damage.rounding import round_to_bf16, round_to_fp16
from precsearch.probe.damage.update import StepDtypes
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]
CFG = ModelConfig(vocab_size=512, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=512, max_seq_len=256)
PROBE = ProbeSection(steps=10, micro_batch=4, seq_len=256, lr=1e-3, device="cuda")
SETTINGS = DamageSection(states=[1.0], batches=4, tokens_per_step=4 * 256)
DEV = torch.device("cuda")


@pytest.fixture(scope="module")
def data():
    if (error := te_import_error()) is not None:
        pytest.skip(error)
    return TokenBatches(synthetic_tokens(200_000, CFG.vocab_size, seed=0), seq_len=256, micro_batch=4, seed=0,
                        eval_batches=2)


def _read(data, backend: str, policy: Policy) -> dict:
    return DamageReader(CFG, PROBE, data, get_backend(backend, DEV), DEV, SETTINGS).read(policy)


def _fp8(precision: Precision, modules=("decoder.layers.*",)) -> Policy:
    return Policy(rules=(Rule("fp8", modules, precision),))


def test_te_bf16_reads_a_sliver_of_fp8(data):
    bf16 = _read(data, "te", Policy.bf16(None))["value"]
    fp8 = _read(data, "te", _fp8(Precision.FP8_CURRENT))["value"]
    print(f"TE BF16 {bf16:.3g}, FP8 current {fp8:.3g}")
    assert fp8 > 0 and abs(bf16) < 0.05 * fp8


def test_fused_and_split_mlp_units_are_both_found(data):
    fused = _read(data, "te", _fp8(Precision.FP8_CURRENT, ("*.mlp.*",)))  # one LayerNormMLP per block
    split = _read(data, "te", _fp8(Precision.FP8_CURRENT, ("*.linear_fc1",)))  # fc1 FP8, fc2 BF16: two modules
    fc1 = "decoder.layers.0.mlp.linear_fc1"
    a, b = (r["states"][0]["units"][fc1]["grad_noise"][0] for r in (fused, split))
    print(f"fc1 reading fused {a:.3g}, split {b:.3g}")
    assert a > 0 and b > 0 and 0.1 < a / b < 10


def test_te_and_emulated_fp8_current_agree_in_size(data):
    te = _read(data, "te", _fp8(Precision.FP8_CURRENT))["states"][0]["total"]
    emulated = _read(data, "emulated", _fp8(Precision.FP8_CURRENT))["states"][0]["total"]
    for measure in ("grad_noise", "grad_var_noise", "update_noise"):
        print(f"{measure}: TE {te[measure][0]:.3g}, emulated {emulated[measure][0]:.3g}")
        assert 1 / 5 < te[measure][0] / emulated[measure][0] < 5, measure


def test_the_readers_kept_bf16_side_is_not_counted_in_a_probes_peak(data):
    """The reader keeps the BF16 gradients of every state on the GPU between trials; a probe run after it must
    measure the same peak as before it (``run_probe``'s ``held_bytes``), or every trial after the first of a
    study read by ``damage`` shows the reader's gigabytes as its own memory."""
    from precsearch.probe.runner import run_probe

    backend = get_backend("te", DEV)
    policy = _fp8(Precision.FP8_CURRENT)
    before = run_probe(CFG, PROBE, policy, data, backend, DEV).peak_memory_bytes
    reader = DamageReader(CFG, PROBE, data, backend, DEV, SETTINGS)
    reader.read(policy)
    held = reader.device_bytes()
    after = run_probe(CFG, PROBE, policy, data, backend, DEV, held_bytes=held).peak_memory_bytes
    print(f"peak before {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB, reader holds {held / 2**20:.1f} MiB")
    assert held > 0.1 * before  # the case means something: the reader holds a real share
    assert abs(after - before) < 0.02 * before


def test_states_kept_on_the_device_are_there_counted_and_read_as_the_host_ones(data):
    """``keep_states: device`` keeps each state's weights and moments on the GPU (``host``: pinned host copies),
    ``device_bytes`` counts them beside the gradients, and the reading is the host one's (up to the GPU's
    run-to-run noise: each reader trains its own BF16 run)."""
    backend = get_backend("emulated", DEV)
    policy = _fp8(Precision.FP8_CURRENT)
    # named: the default (auto) puts this small probe's states on the device
    host = DamageReader(CFG, PROBE, data, backend, DEV, SETTINGS.model_copy(update={"keep_states": "host"}))
    device = DamageReader(CFG, PROBE, data, backend, DEV, SETTINGS.model_copy(update={"keep_states": "device"}))
    a, b = host.read(policy), device.read(policy)

    def tensors(reader: DamageReader) -> list[torch.Tensor]:
        (state, _), = reader.bf16_sides(None)
        return [*state.weights.values(), *(m for pair in state.moments.values() for m in pair)]

    assert all(t.device.type == "cpu" and t.is_pinned() for t in tensors(host))
    assert all(t.is_cuda and not t.is_pinned() for t in tensors(device))
    state_bytes = sum(t.numel() * t.element_size() for t in tensors(device))
    assert device.device_bytes() == host.device_bytes() + state_bytes
    print(f"compare: host {a['seconds_by_part']['compare']:.3f} s, device {b['seconds_by_part']['compare']:.3f} s")
    assert b["value"] == pytest.approx(a["value"], rel=1e-3)


@pytest.mark.parametrize("knobs", [MemoryKnobs(), MemoryKnobs(moment_dtype="bf16", master_weights=True),
                                   MemoryKnobs(moment_dtype="fp8", master_weights=True),
                                   MemoryKnobs(master_weights=True, master_dtype="fp16")],
                         ids=["default", "bf16 moments", "fp8 moments", "fp16 master"])
def test_the_compiled_compare_is_the_op_by_op_one_on_cuda(knobs):
    """On CUDA the chunk's step is compiled (no fall-back here); its Gram matrices differ from the op-by-op ones
    by no more than float32 rounding does, with the state on the device and on the host (pinned, copied on a
    side stream), over several chunks of a 3M-element unit.

    "What float32 rounding does" is measured, not assumed: the op-by-op compare again with the learning rate
    moved by two float32 ulps (every update then differs in its last bits, as a fused multiply-add makes it
    differ, and a stored BF16/FP16 value flips its rounding where it sits near a boundary). The compiled one
    must stay within 10x that change, plus 1e-9 of the matrix for the families the learning rate does not touch
    (``g``, ``e``: casts and differences, equal up to summation order). A rounding the compiled chain leaves
    out moves the update error by far more: with BF16/FP16 storages written as cast round trips, on the H200
    (torch 2.11, 2026-12-03) ``ue`` was 3e-4 / 67% / 2.6% off for BF16 moments / the default knobs / an FP16
    master, against 4e-7 to 1.3e-6 for the two ulps (what :mod:`precsearch.probe.damage.rounding` mends).
    """
    gen = torch.Generator(device=DEV).manual_seed(0)
    shape = (1536, 2048)
    weight = torch.randn(shape, generator=gen, device=DEV) * 0.02
    moments = (torch.randn(shape, generator=gen, device=DEV) * 1e-3,
               torch.rand(shape, generator=gen, device=DEV) * 1e-6)
    g = [torch.randn(shape, generator=gen, device=DEV).to(torch.bfloat16) for _ in range(4)]
    p = [(t.float() + 0.01 * torch.randn(shape, generator=gen, device=DEV)).to(torch.bfloat16) for t in g]
    dtypes, args, chunk = StepDtypes.of(knobs, "bf16"), (7, 3e-4, (0.9, 0.95), 0.1), 2**20
    eager = compare.compare_unit(g, p, weight, moments, dtypes, args, DEV, chunk, compile_compare=False)
    nudged = (args[0], args[1] * (1 + 2**-22), *args[2:])
    rounding = compare.compare_unit(g, p, weight, moments, dtypes, nudged, DEV, chunk, compile_compare=False)
    host = (weight.cpu().pin_memory(), tuple(m.cpu().pin_memory() for m in moments))
    for where, (w, m) in (("device", (weight, moments)), ("host", host)):
        fused = compare.compare_unit(g, p, w, m, dtypes, args, DEV, chunk, compile_compare=True)
        assert compare.compile_failure() is None
        for key in compare.GRAMS:
            scale = float(eager[key].diagonal().abs().max())
            assert scale > 0
            off = float((fused[key] - eager[key]).abs().max()) / scale
            ulp = float((rounding[key] - eager[key]).abs().max()) / scale
            print(f"{where} {key}: compiled vs op by op {off:.2e}, two lr ulps {ulp:.2e}")
            assert off <= 10 * ulp + 1e-9, f"{where} {key}: compiled {off:.2e} off, rounding moves it {ulp:.2e}"


def test_the_bitwise_rounding_compiled_on_cuda_is_the_cast():
    """The BF16/FP16 storages' rounding, compiled by inductor into a Triton kernel, gives the casts' values bit
    for bit, for float32 values of every exponent and next to every rounding boundary."""
    x = every_exponent(256).to(DEV)
    fused = torch.compile(lambda t: (round_to_bf16(t), round_to_fp16(t)), dynamic=True,
                          options=compare.COMPILE_OPTIONS)
    folded = torch.compile(lambda t: t.to(torch.bfloat16).float(), options=compare.COMPILE_OPTIONS)(x)
    print(f"a compiled cast round trip left {int((folded != x.to(torch.bfloat16).float()).sum())} of {x.numel()} "
          "values unrounded")
    for name, got, cast in zip(("bf16", "fp16"), fused(x), (torch.bfloat16, torch.float16)):
        got, want, inputs = got.cpu(), x.cpu().to(cast).float(), x.cpu()
        wrong = differing(got, want)
        examples = [f"{float(a)!r} -> {float(b)!r} (cast {float(c)!r})"
                    for a, b, c in zip(inputs[wrong][:5], got[wrong][:5], want[wrong][:5])]
        print(f"{name}: {int(wrong.sum())} of {x.numel()} differ from the cast", *examples, sep="\n  ")
        assert not wrong.any(), name
