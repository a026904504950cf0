"""``objectives.damage.keep_states``: the BF16 run's states kept on the device instead of in host memory.

On a CPU both places are host memory, so the device path is tested by what it must do wherever it runs: keep
copies (not views of the model the run trains on), never pinned, on the model's own device (a fake accelerator:
the meta device), counted by ``device_bytes`` only off the CPU, and read the same numbers as the host path.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.damage import DamageReader
from precsearch.probe.damage.reading import Side
from precsearch.probe.damage.states import State, _snapshot
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
PROBE = ProbeSection(steps=8, micro_batch=4, seq_len=32, lr=3e-3, lr_warmup_steps=2, device="cpu")


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(synthetic_tokens(30_000, CFG.vocab_size, seed=0), seq_len=32, micro_batch=4, seed=0,
                        eval_batches=2)


def _reader(data, keep: str) -> DamageReader:
    settings = DamageSection(states=[0.0, 1.0], batches=4, tokens_per_step=4096, keep_states=keep)
    return DamageReader(CFG, PROBE, data, EmulatedBackend(), torch.device("cpu"), settings)


class _Net(nn.Module):
    """One unit (``fc``) with a bias: a weight with moments and a parameter without."""

    def __init__(self, device: str = "cpu"):
        super().__init__()
        self.fc = nn.Linear(3, 4, device=device)


def _trained(device: str = "cpu") -> tuple[_Net, torch.optim.Optimizer]:
    """A net after one AdamW step on CPU, so that its unit has moments."""
    net = _Net(device)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    net.fc(torch.randn(2, 3)).sum().backward()
    opt.step()
    return net, opt


def _tensors(state: State) -> list[torch.Tensor]:
    return [*state.weights.values(), *(m for pair in state.moments.values() for m in pair)]


def test_states_kept_on_the_device_are_float32_copies_not_views():
    """A device-kept state is a copy, unpinned: training on after the snapshot (here: the model's parameters
    and moments changed in place) leaves it as it was."""
    net, opt = _trained()
    state = _snapshot(net, opt, ["fc"], 1, 0.1, keep_on_device=True)
    before = [t.clone() for t in _tensors(state)]
    assert set(state.weights) == {"fc.weight", "fc.bias"} and set(state.moments) == {"fc"}
    assert all(t.dtype == torch.float32 and not t.is_pinned() for t in _tensors(state))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
        for st in opt.state.values():
            st["exp_avg"].add_(1.0)
            st["exp_avg_sq"].add_(1.0)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(state), before))


def test_states_kept_on_the_device_stay_on_the_models_device():
    """On a model off the CPU (the meta device standing in for an accelerator) the device path keeps every
    tensor there, where the host path would copy it out."""
    net = _Net("meta")
    moments = {"exp_avg": torch.empty(4, 3, device="meta"), "exp_avg_sq": torch.empty(4, 3, device="meta")}
    opt = SimpleNamespace(state={net.fc.weight: moments})
    state = _snapshot(net, opt, ["fc"], 1, 0.1, keep_on_device=True)
    assert all(t.device.type == "meta" and t.dtype == torch.float32 for t in _tensors(state))


def test_device_bytes_counts_states_only_off_the_cpu(data):
    """``device_bytes`` counts a kept state's weights and moments when they are on an accelerator (meta here),
    with the kept gradients; a CPU state and CPU gradients count nothing."""
    reader = _reader(data, "device")
    reader.read(Policy.bf16(None))
    assert reader.device_bytes() == 0  # on a CPU every state and gradient is in host memory
    net = _Net("meta")
    moments = {"exp_avg": torch.empty(4, 3, device="meta"), "exp_avg_sq": torch.empty(4, 3, device="meta")}
    on_device = _snapshot(net, SimpleNamespace(state={net.fc.weight: moments}), ["fc"], 1, 0.1, keep_on_device=True)
    on_host = State(step=0, weights={"w": torch.empty(100)}, moments={"w": (torch.empty(100), torch.empty(100))})
    grads = Side(grads=[{"fc": torch.empty(4, 3, dtype=torch.bfloat16, device="meta")}], eval_losses=[])
    reader._bf16[None] = [(on_device, grads), (on_host, Side(grads=[{"w": torch.empty(100)}], eval_losses=[]))]
    weights, bias, moment = 4 * 3 * 4, 4 * 4, 4 * 3 * 4
    assert reader.device_bytes() == weights + bias + 2 * moment + 4 * 3 * 2


def _numbers(reading: dict) -> dict:
    return {k: v for k, v in reading.items() if k not in ("seconds", "seconds_by_part", "bf16_side_s", "states_on")}


def test_a_reading_with_device_states_equals_the_host_one(data):
    """The same reading, exactly, whichever place the states are kept in (an FP8 policy with BF16 moments, so
    that the gradient and the update figures are all read off zero)."""
    policy = Policy(rules=(Rule(name="all", modules=("*",), precision=Precision.FP8_CURRENT),),
                    memory=MemoryKnobs(moment_dtype="bf16", master_weights=True))
    host, device = _reader(data, "host"), _reader(data, "device")
    a, b = host.read(policy), device.read(policy)
    assert a["states"][-1]["total"]["update_norm"][0] > 0 and a["states"][-1]["total"]["grad_norm"][0] > 0
    assert _numbers(a) == _numbers(b)
    state = device.bf16_sides(None)[-1][0]
    assert all(not t.is_pinned() for t in _tensors(state))


def test_keep_states_is_auto_host_device_or_disk():
    """``auto`` is the default: the device where the states fit (:mod:`precsearch.probe.damage.placement`)."""
    assert DamageSection().keep_states == "auto"
    with pytest.raises(ValueError, match=r"keep_states"):
        DamageSection(keep_states="gpu")


def test_auto_keeps_the_states_on_disk_on_a_cpu(data, monkeypatch):
    """On a CPU there is no copy to save and host memory is the probe's: ``auto`` keeps the states on disk
    (where the temporary directory has room and they are not small; tests/probe/test_damage_disk.py) and reads
    as ``host`` does, to the bit."""
    from precsearch.probe.damage import placement

    monkeypatch.setattr(placement, "HOST_SMALL_BYTES", 0)  # this test's model is small
    auto, host = _reader(data, "auto"), _reader(data, "host")
    policy = Policy(rules=(Rule(name="all", modules=("*",), precision=Precision.FP8_CURRENT),))
    a = auto.read(policy)
    assert a["states_on"] == "disk" and _numbers(a) == _numbers(host.read(policy))
    assert auto.device_bytes() == 0 and auto.host_bytes() == 0
    auto.close()


def test_auto_keeps_a_small_models_states_in_a_cpus_memory(data):
    """States and gradients of at most ``HOST_SMALL_BYTES`` stay in memory on a CPU: nothing to save there, and
    disk costs time (the CPU quickstart's are a few MiB)."""
    from precsearch.probe.damage import placement

    auto = _reader(data, "auto")
    policy = Policy(rules=(Rule(name="all", modules=("*",), precision=Precision.FP8_CURRENT),))
    assert auto.read(policy)["states_on"] == "host" and 0 < auto.host_bytes() <= placement.HOST_SMALL_BYTES
    auto.close()
