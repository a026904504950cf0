"""The probe compiles its blocks where its backend's FP8 is fast only compiled (torchao on a GPU), as torchtitan
and Accelerate's regional compilation run them: the study then times, and the memory model counts, what those
stacks run. Eager torchao FP8 runs slower than BF16, so without this a torchtitan study's speed-ups would be
those of a set-up nobody trains with.

On a CPU the compile runs dynamo with its ``eager`` backend (no code generation): what is checked is that the
blocks are compiled in place, that names, state and results are the eager model's, that the probe asks for it
and predicts the compiled peak, and that a study's many block variants do not hit dynamo's recompile limit
(past it, dynamo runs the frame eager without a word).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from precsearch import cpu_bf16

from precsearch.backends.capability import torchao_import_error
from precsearch.backends.emulated import EmulatedBackend
from precsearch.backends.torchao_backend import TorchaoBackend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe import runner
from precsearch.probe.data import TokenBatches
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.measure.signals import Signals
from precsearch.probe.model.llama3 import CompiledForward, Llama3, ModelConfig, build_model

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
CUDA, CPU = torch.device("cuda"), torch.device("cpu")
needs_torchao = pytest.mark.skipif(torchao_import_error() is not None, reason="torchao does not import")


def test_only_torchao_on_a_gpu_compiles_the_probe_blocks():
    assert TorchaoBackend().probe_compiles_blocks(CUDA)
    assert not TorchaoBackend().probe_compiles_blocks(CPU)  # FP8 is emulated there: eager
    assert not TorchaoBackend(emulate=True).probe_compiles_blocks(CUDA)
    assert not TorchaoBackend(compile=True).probe_compiles_blocks(CUDA)  # the whole model is compiled instead
    assert not EmulatedBackend().probe_compiles_blocks(CUDA)  # the base class's answer (TE's too)


def test_compile_blocks_keeps_the_eager_model():
    eager = build_model(CFG, 0, CPU)
    model = build_model(CFG, 0, CPU)
    names = list(model.state_dict())
    model.compile_blocks(backend="eager")
    assert list(model.state_dict()) == names
    assert all(isinstance(layer.forward, CompiledForward) for layer in model.decoder.layers)
    assert not isinstance(eager.decoder.layers[0].forward, CompiledForward)
    ids = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(ids, ids), eager(ids, ids), rtol=0, atol=0)


def _fp8_mlp_probe(cfg: ModelConfig) -> tuple[Policy, ProbeSection, TokenBatches]:
    """A 4-step probe of ``cfg`` with FP8 current MLPs: the stat steps are 0 and 3."""
    policy = Policy(rules=(Rule("mlp", ("*.mlp.*",), Precision.FP8_CURRENT),))
    probe = ProbeSection(steps=4, micro_batch=2, seq_len=32, lr=1e-3, lr_warmup_steps=1, device="cpu", seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (16 * 33,), generator=torch.Generator().manual_seed(0))
    return policy, probe, TokenBatches(tokens, seq_len=32, micro_batch=2, seed=0, eval_batches=1)


class _CompilesOnCpu(TorchaoBackend):
    """torchao emulated, with the probe's block compile a GPU would get."""

    def probe_compiles_blocks(self, device: torch.device) -> bool:
        return True


@needs_torchao
def test_the_probe_compiles_its_blocks_and_predicts_the_compiled_peak(monkeypatch):
    compiled = []
    real = Llama3.compile_blocks

    def compile_blocks(self, **kwargs):
        compiled.append(self)
        real(self, backend="eager")

    monkeypatch.setattr(Llama3, "compile_blocks", compile_blocks)
    policy, probe, data = _fp8_mlp_probe(CFG)

    with torch._dynamo.config.patch(recompile_limit=8):  # dynamo's default
        result = runner.run_probe(CFG, probe, policy, data, _CompilesOnCpu(emulate=True), CPU)
        assert torch._dynamo.config.recompile_limit == runner.RECOMPILE_LIMIT
    eager = runner.run_probe(CFG, probe, policy, data, TorchaoBackend(emulate=True), CPU)

    assert len(compiled) == 1 and not result.diverged
    torch.testing.assert_close(result.losses, eager.losses, rtol=1e-3, atol=0)  # the same training, compiled
    # the signals' observers ran on the stat steps (0 and the last), each block's, as in the eager run
    compiled_signals, eager_signals = (Signals.from_dict(r.signals).series for r in (result, eager))
    for kind in ("attention_logit", "kurtosis"):
        assert [s for s, _ in compiled_signals[kind]] == [s for s, _ in eager_signals[kind]] == [0, 3]
        torch.testing.assert_close([v for _, v in compiled_signals[kind]], [v for _, v in eager_signals[kind]],
                                   rtol=1e-3, atol=0)
    precisions = runner.backend_precisions(policy, CFG)
    kw = dict(seq_len=32, micro_batch=2, param_dtype=probe.param_dtype, memory=policy.memory, fp8_linear="torchao")
    assert result.predicted_memory == predict_peak(CFG, precisions, compiled_blocks=True, **kw).to_dict()
    assert eager.predicted_memory == predict_peak(CFG, precisions, compiled_blocks=False, **kw).to_dict()
    assert result.predicted_memory != eager.predicted_memory


@needs_torchao
def test_a_studys_block_variants_stay_under_the_recompile_limit():
    """Every combination of FP8 units a space like torchtitan's offers, FP8 on and off, with and without the
    signals' observers, each in a fresh model, as one probe process meets them: none runs past dynamo's limit."""
    backend = TorchaoBackend(emulate=True)
    ids = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cfg = CFG.with_overrides(n_layers=3)
    with torch._dynamo.config.patch(recompile_limit=8):  # dynamo's default; the runner raises it
        _every_variant(cfg, backend, ids)
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["total"] > 8  # more variants than the default limit holds
    assert frames["ok"] == frames["total"]  # each compiled: none fell back to eager


def _every_variant(cfg: ModelConfig, backend: TorchaoBackend, ids: torch.Tensor) -> None:
    quiet = torch.compiler.disable(lambda q, k: None)  # a stat step's observer, as the signals attach it
    for edge, attention, mlp in itertools.product((False, True), repeat=3):
        rules = [Rule(name, (pattern,), Precision.FP8_CURRENT) for name, pattern, on in (
            ("edge", "decoder.layers.0.*", edge), ("attention", "*.self_attention.*", attention),
            ("mlp", "*.mlp.*", mlp)) if on]
        model = runner.build_probe(cfg, Policy(rules=tuple(rules)), backend, CPU, 0)
        runner.compile_probe_blocks(model, backend="eager")
        for fp8_on, observed in itertools.product((False, True), repeat=2):
            for layer in model.decoder.layers:
                layer.self_attention.observe_qk = quiet if observed else None
            with backend.autocast(model, enabled=fp8_on):
                model(ids, ids).backward()


def test_a_pass_without_gradients_runs_the_blocks_eager():
    """Evaluation and held-out losses are not timed: compiling them would be one more compile per variant."""
    model = build_model(CFG, 0, CPU)
    model.compile_blocks(backend="eager")
    ids = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        model(ids, ids)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0
    model(ids, ids).backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0


def _graphs_of_a_compiled_probe(n_layers: int) -> int:
    cfg = CFG.with_overrides(n_layers=n_layers)
    policy, probe, data = _fp8_mlp_probe(cfg)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    runner.run_probe(cfg, probe, policy, data, _CompilesOnCpu(emulate=True), CPU)
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@needs_torchao
def test_a_compiled_probe_compiles_each_block_variant_once_whatever_its_depth(monkeypatch):
    """Every block with the same units compiles once, for the steps without the signals' observers and once
    with them (the stat steps), however many blocks there are. Traced, an observer's own values (its block's
    index, whether its step is a stat step) made dynamo compile every block again: on an H100 a torchtitan
    study then finished no trial in 200 s."""
    real = Llama3.compile_blocks
    monkeypatch.setattr(Llama3, "compile_blocks", lambda self, **kw: real(self, backend="eager"))
    # the GEMM as a GPU runs it: this CPU's float32 fallback for BF16 GEMMs breaks the graph at its own check
    monkeypatch.setattr(cpu_bf16, "linear", lambda x, weight, bias=None: F.linear(x, weight, bias))
    two, four = _graphs_of_a_compiled_probe(2), _graphs_of_a_compiled_probe(4)
    assert two == four
    assert 1 < four <= 4  # the whole block; with an observer, the block before and after it
