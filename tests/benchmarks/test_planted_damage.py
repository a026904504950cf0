"""benchmarks/planted_damage.py (the judge's graded series) and the judge's target-set Spearman."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity_judge  # noqa: E402
import planted_damage  # noqa: E402

from precsearch.config.space import DamageSection, ProbeSection  # noqa: E402
from precsearch.policy import Policy, Rule  # noqa: E402
from precsearch.precision import Precision  # noqa: E402
from precsearch.probe.damage import DamageReader  # noqa: E402
from precsearch.probe.data import TokenBatches, synthetic_tokens  # noqa: E402
from precsearch.probe.model.llama3 import ModelConfig  # noqa: E402


def test_rounding_keeps_the_exponent_and_the_bits_asked_for():
    """Known values: 1.3 = 0.65 x 2 -> 3 bits keep 0.625 (1.25), 1 bit 0.75 (1.5), 0 bits 0.5 or 1 (1 or 2)."""
    x = torch.tensor([1.3, -1.3, 0.0, 3.0, 1.5])
    assert planted_damage.round_mantissa(x, 3).tolist() == [1.25, -1.25, 0.0, 3.0, 1.5]
    assert planted_damage.round_mantissa(x, 1).tolist() == [1.5, -1.5, 0.0, 3.0, 1.5]
    assert planted_damage.round_mantissa(x, 0).tolist() == [1.0, -1.0, 0.0, 4.0, 2.0]  # ties to even: 0.75 -> 1
    # the worst relative error is half a step just above a power of two: 1 / (2^(bits+1) + 1), and reached
    y = torch.linspace(0.1, 10, 100_001)
    for bits in (0, 1, 2, 3):
        rel = ((planted_damage.round_mantissa(y, bits) - y).abs() / y).max().item()
        bound = 1 / (2 ** (bits + 1) + 1)
        assert 0.99 * bound < rel <= bound * (1 + 1e-5), (bits, rel, bound)


def test_fewer_bits_read_more_damage_and_the_rest_stays_bf16():
    """The series is graded: the fixed-state reading rises as bits fall (each bit about doubles the error, so
    about 4x the error energy); a unit not assigned fp8_current is left BF16, and another recipe is refused."""
    cfg = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
    probe = ProbeSection(steps=6, micro_batch=4, seq_len=32, lr=3e-3, lr_warmup_steps=2, device="cpu")
    data = TokenBatches(synthetic_tokens(30_000, 256, seed=0), seq_len=32, micro_batch=4, seed=0, eval_batches=2)
    settings = DamageSection(states=[1.0], batches=4, tokens_per_step=4096)
    policy = Policy(rules=(Rule("fp8", ("decoder.layers.*",), Precision.FP8_CURRENT),))
    values = [DamageReader(cfg, probe, data, planted_damage.MantissaBackend(bits), torch.device("cpu"),
                           settings).read(policy)["value"] for bits in (0, 1, 2, 3)]
    assert all(a > 2 * b for a, b in zip(values, values[1:])), values
    model = planted_damage.MantissaBackend(1).convert(
        __import__("precsearch.probe.model.llama3", fromlist=["build_model"]).build_model(cfg, 0, torch.device("cpu")),
        policy.layer_recipes(["decoder.layers.0.mlp.linear_fc1"], 2))
    assert isinstance(model.get_submodule("decoder.layers.0.mlp.linear_fc1"), planted_damage.RoundedLinear)
    assert not isinstance(model.get_submodule("decoder.layers.0.mlp.linear_fc2"), planted_damage.RoundedLinear)


def test_the_target_spearman_takes_the_graded_series_and_the_decided_policies():
    names = ["benign", "undecided", "g0", "g1"]
    truths = [{"mean": -0.01, "call": "benign"}, {"mean": 0.05, "call": "undecided"},
              {"mean": 0.03, "call": "damaging"}, {"mean": 0.01, "call": "undecided"}]
    out = fidelity_judge.judge(names, truths, [0.1, 0.0, 0.9, 0.5], limit=0.8, graded=[False, False, True, True])
    assert out["target"] == ["benign", "g0", "g1"]  # the undecided policy outside the series is left out
    assert out["spearman_target"] == 1.0 and out["spearman"] < 1.0
    assert out["false_stable"] == [] and out["false_unstable"] == []
