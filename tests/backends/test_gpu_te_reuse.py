"""A Transformer Engine probe model kept between probes (:mod:`precsearch.probe.model.reuse`) is the fresh build's.

GPU only (the H200 through the device tool). What would be wrong if these failed:
* a kept TE stack set again from a seed or a state's weights holds other values than a fresh build: the plain
  view (:meth:`TEBackend.plain_tensors`) maps a plain Parameter to the wrong TE tensor (a fused MLP's fc1 and
  fc2, a fused RMSNorm weight), or a cast rounds differently;
* delayed scaling's scale and amax history carry over into the next probe (``reset_converted`` missed a module),
  so a trial would start from the previous trial's scales;
* training or a fixed-state reading through a kept model differs from fresh builds by more than two fresh builds
  differ from each other (TE's attention backward may use atomics: the control measures that spread, and with
  ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` it is expected to be zero).
"""

from __future__ import annotations

import math

import pytest
import torch

from precsearch.backends import get_backend
from precsearch.backends.capability import te_import_error
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import Precision
from precsearch.probe import runner
from precsearch.probe.damage import DamageReader
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.model.reuse import ModelCache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]
CFG = ModelConfig(vocab_size=512, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=512, max_seq_len=256)
DEV = torch.device("cuda")
BF16 = Policy.bf16(None)
#: fc1 and fc2 differ (split MLP units), delayed scaling (state to reset), the output layer in FP8 (a TE head)
MIXED = Policy(rules=(Rule("fc1", ("*.linear_fc1",), Precision.FP8_CURRENT),
                      Rule("rest", ("*",), Precision.FP8_DELAYED)))
#: one recipe for the whole MLP: a fused te.LayerNormMLP
FUSED = Policy(rules=(Rule("blocks", ("decoder.layers.*",), Precision.FP8_DELAYED),), warmup_steps=2)


@pytest.fixture(scope="module")
def data():
    if (error := te_import_error()) is not None:
        pytest.skip(error)
    return TokenBatches(synthetic_tokens(200_000, CFG.vocab_size, seed=0), seq_len=128, micro_batch=2, seed=0,
                        eval_batches=2)


@pytest.fixture(autouse=True)
def deterministic(monkeypatch):
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")  # read by TE's attention when a module is built


def _probe(seed: int, param_dtype: str = "bf16") -> ProbeSection:
    return ProbeSection(steps=6, micro_batch=2, seq_len=128, lr=1e-3, lr_warmup_steps=1, seed=seed, device="cuda",
                        param_dtype=param_dtype)


def _run(data, policy: Policy, seed: int, models: ModelCache | None, param_dtype: str = "bf16"):
    result = runner.run_probe(CFG, _probe(seed, param_dtype), policy, data, get_backend("te", DEV), DEV,
                              models=models)
    return [*result.losses, *result.grad_norms, result.eval_loss]


def _gap(a: list[float], b: list[float]) -> float:
    """The largest difference of two lists of figures; two NaNs at one place count as equal, one as inf."""
    return max(0.0 if x == y or (math.isnan(x) and math.isnan(y)) else abs(x - y)
               if not (math.isnan(x) or math.isnan(y)) else math.inf for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("param_dtype", ["bf16", "fp32"])
def test_probes_through_a_kept_te_model_train_as_fresh_builds(data, param_dtype):
    """BF16 references, then two policies, each for two seeds: every probe as a fresh build trains it."""
    sequence = [(BF16, 0), (BF16, 1), (MIXED, 0), (MIXED, 1), (FUSED, 0), (FUSED, 2)]
    models = ModelCache()
    for policy, seed in sequence:
        kept = _run(data, policy, seed, models, param_dtype)
        fresh, control = (_run(data, policy, seed, None, param_dtype) for _ in range(2))
        print(f"{param_dtype} seed {seed}: kept-fresh {_gap(kept, fresh):.3g}, fresh-fresh {_gap(fresh, control):.3g}")
        assert _gap(kept, fresh) <= _gap(fresh, control), (policy, seed)
    assert models.reused == 3


@pytest.mark.parametrize("weights_on", ["device", "pinned host"])
def test_a_kept_model_holds_a_fresh_builds_weights_and_no_scaling_history(data, weights_on):
    """After a delayed-scaling probe, the kept stack set to another seed and to a state's weights equals a fresh
    build parameter by parameter, and every delayed-scaling state is back to scale 1 and an empty history. The
    state's FP32 weights on the device or in page-locked host memory (a state the reader keeps on the host: the
    kept BF16 stack rounds them on the GPU, a fresh build loads them as they are and casts after)."""
    backend, models = get_backend("te", DEV), ModelCache()
    _run(data, MIXED, 0, models)
    probe = _probe(3)
    kept = runner._probe_model(CFG, probe, MIXED, backend, DEV, runner.ONE_PROCESS, None, models)
    assert backend.reset_converted(kept)
    fresh = runner.build_probe(CFG, MIXED, backend, DEV, 3, "bf16")
    _same_parameters(kept, fresh)
    states = [m.fp8_meta[k] for m in kept.modules() if isinstance(getattr(m, "fp8_meta", None), dict)
              for k in ("scaling_fwd", "scaling_bwd") if hasattr(m.fp8_meta.get(k), "amax_history")]
    assert states, "the delayed-scaling units kept no recipe state: nothing was reset"
    assert all(torch.all(s.amax_history == 0) and torch.all(s.scale == 1) for s in states)
    weights = {k: v.float() * 1.5 for k, v in runner.build_probe(CFG, BF16, get_backend("emulated", DEV), DEV, 9,
                                                                   "fp32").state_dict().items()}
    if weights_on == "pinned host":
        weights = {k: v.cpu().pin_memory() for k, v in weights.items()}
    models.keep(kept)
    at_state = runner._probe_model(CFG, probe, MIXED, backend, DEV, runner.ONE_PROCESS, None, models, weights)
    _same_parameters(at_state, runner.build_probe(CFG, MIXED, backend, DEV, 3, "bf16", weights=weights))
    assert models.reused == 2


@pytest.mark.parametrize("keep_states", ["device", "host"])
def test_a_reading_through_the_kept_model_equals_fresh_builds(data, keep_states):
    """The fixed-state reading of a delayed-scaling policy after its trial's probe: the kept model set to each
    state gives the figures of readers that build every model, with the states on the device or in host memory."""
    settings = DamageSection(states=[0.5, 1.0], batches=3, warm_batches=1, tokens_per_step=256,
                             keep_states=keep_states)
    probe, backend = _probe(0), get_backend("te", DEV)
    values = []
    for models in (ModelCache(), None, None):
        reader = DamageReader(CFG, probe, data, backend, DEV, settings, models=models)
        if models is not None:
            runner.run_probe(CFG, probe, MIXED, data, backend, DEV, models=models)
        reading = reader.read(MIXED)
        values.append([v for s in reading["states"] for pair in s["total"].values() for v in pair[:1]])
    kept, fresh, control = values
    print(f"reading kept-fresh {_gap(kept, fresh):.3g}, fresh-fresh {_gap(fresh, control):.3g}")
    assert _gap(kept, fresh) <= _gap(fresh, control)
    assert max(abs(v) for v in kept if not math.isnan(v)) > 0


def _same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name
