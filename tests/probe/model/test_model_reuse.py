"""A probe model kept between probes (:mod:`precsearch.probe.model.reuse`) trains exactly as a fresh build.

If these fail, a study's probe process would score a trial on a model that is not the one a fresh
build gives for its seed and policy: weights drawn in another order or from another stream, FP8
scaling history (delayed scaling's amax) carried over from the previous probe, or gradients left
from it. The losses are compared bit for bit, not within a tolerance: the reuse must change nothing.
"""

from __future__ import annotations

import pytest
import torch

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.precision import Precision
from precsearch.probe import runner
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.model.reuse import ModelCache

CFG = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
CPU = torch.device("cpu")
DATA = TokenBatches(synthetic_tokens(20_000, CFG.vocab_size, 0), seq_len=16, micro_batch=2, seed=0, eval_batches=1)
BF16 = Policy.bf16()
FP8 = Policy(default=Precision.FP8_DELAYED, warmup_steps=2)  # delayed scaling: an amax history to reset
NVFP4 = Policy(default=Precision.NVFP4)  # stochastic rounding: streams seeded from torch.initial_seed()


def _probe(seed: int, param_dtype: str = "fp32") -> ProbeSection:
    return ProbeSection(steps=6, micro_batch=2, seq_len=16, lr=3e-3, seed=seed, device="cpu",
                        param_dtype=param_dtype, lr_warmup_steps=1)


def _run(policy: Policy, seed: int, models: ModelCache | None, param_dtype: str = "fp32"):
    result = runner.run_probe(CFG, _probe(seed, param_dtype), policy, DATA, EmulatedBackend(), CPU, models=models)
    return result.losses, result.grad_norms, result.eval_loss


@pytest.mark.parametrize("param_dtype", ["fp32", "bf16"])
def test_a_reused_model_trains_to_the_losses_of_a_fresh_build_across_policy_changes(param_dtype):
    """BF16 references (two seeds), then FP8 trials, back to BF16: each probe as a fresh build gives it."""
    sequence = [(BF16, 0), (BF16, 1), (FP8, 0), (FP8, 1), (BF16, 0), (NVFP4, 2), (NVFP4, 2), (FP8, 0)]
    models = ModelCache()
    for policy, seed in sequence:
        assert _run(policy, seed, models, param_dtype) == _run(policy, seed, None, param_dtype), (policy, seed)
    assert models.reused == 3  # the second seed of BF16 and of FP8, the NVFP4 rerun: the rest were rebuilt


def test_a_model_whose_probe_raised_is_not_kept():
    """A probe that failed part-way may leave hooks or half-made state on its model: the next probe rebuilds."""
    models = ModelCache()
    _run(BF16, 0, models)

    def fail(step, loss, grad_norm):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        runner.run_probe(CFG, _probe(0), BF16, DATA, EmulatedBackend(), CPU, on_step=fail, models=models)
    assert _run(BF16, 1, models) == _run(BF16, 1, None)
    assert models.reused == 1  # the failing probe took the kept model; the one after it built afresh


def test_a_backend_that_cannot_reset_its_layers_builds_every_probe():
    """The contract's default: ``reset_converted`` answers False and nothing is reused."""

    class NoReset(EmulatedBackend):
        resets_converted = False

        def reset_converted(self, model):
            return False

    models = ModelCache()
    for seed in (0, 1):
        runner.run_probe(CFG, _probe(seed), FP8, DATA, NoReset(), CPU, models=models)
    assert models.reused == 0
    assert models._kept is None  # not even held: a model no probe can take would only hold (device) memory


def test_a_kept_model_given_a_states_weights_is_the_model_a_fresh_build_makes_from_them():
    """The fixed-state reading sets the trial's model to each state's weights: the same Parameters, to the bit, as
    ``build_probe(weights=...)`` gives, in FP32 and BF16 parameters (the FP32 state rounded once, as a build's
    cast rounds it)."""
    for param_dtype in ("fp32", "bf16"):
        models = ModelCache()
        _run(FP8, 0, models, param_dtype)
        weights = {k: v.float() * 1.37 + 0.01 for k, v in runner.build_probe(CFG, BF16, EmulatedBackend(), CPU, 5)
                   .state_dict().items()}  # values no seed draws, FP32 as a state holds them
        probe = _probe(0, param_dtype)
        kept = runner._probe_model(CFG, probe, FP8, EmulatedBackend(), CPU, runner.ONE_PROCESS, None, models, weights)
        fresh = runner.build_probe(CFG, FP8, EmulatedBackend(), CPU, 0, param_dtype, weights=weights)
        assert models.reused == 1
        for (name, a), (_, b) in zip(kept.state_dict().items(), fresh.state_dict().items(), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), name


def test_a_reading_through_the_probe_process_model_equals_one_that_builds_every_model():
    """A trial's reading takes the trial's model and sets it to each state (two reuses per reading here): the
    figures must be those of fresh builds, for a delayed-scaling policy whose amax history the trial's probe
    filled and whose reading must start it afresh."""
    from precsearch.config.space import DamageSection
    from precsearch.probe.damage import DamageReader

    settings = DamageSection(states=[0.5, 1.0], batches=3, warm_batches=1)
    readings, cache = [], ModelCache()
    for models in (cache, None):
        reader = DamageReader(CFG, _probe(0), DATA, EmulatedBackend(), CPU, settings, models=models)
        reader.bf16_sides(None)  # its second state reuses the first's BF16 model
        if models is not None:
            _run(FP8, 0, models)  # a new structure: built, then kept
        reading = reader.read(FP8)
        readings.append(repr({k: v for k, v in reading.items() if not k.startswith("seconds")}))  # NaN == NaN
    assert readings[0] == readings[1]
    assert cache.reused == 3  # the BF16 side's second state, then the trial's model at both states
