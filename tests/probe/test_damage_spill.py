""":mod:`precsearch.probe.damage.spill`: tensors written to an anonymous file come back with the same bits, whole
or a slice of the flattened tensor at a time; a file has no name and is freed when closed."""

from __future__ import annotations

import pytest
import torch
from _floats import every_exponent, same_bits

from precsearch.probe.damage.spill import Spilled, SpillFile, source, write_all
from precsearch.probe.runner import _load_weights


def test_tensors_come_back_with_their_bits_whole_and_by_slices(tmp_path):
    f = SpillFile(tmp_path)
    values = every_exponent(64).reshape(-1, 8)  # NaNs, infinities, subnormals, both signs
    low = torch.randn(5, 7).to(torch.bfloat16)
    scalar = torch.tensor(3.5)
    a, b, c = f.write(values), f.write(low), f.write(scalar)
    assert f.nbytes == values.numel() * 4 + low.numel() * 2 + 4
    assert same_bits(a.load(), values) and a.load().shape == values.shape
    assert b.load().dtype == torch.bfloat16 and torch.equal(b.load(), low)
    assert c.load().shape == () and c.load().item() == 3.5
    flat = a.reshape(-1)
    assert flat.numel() == values.numel() and flat.device == torch.device("cpu")
    for span in (slice(0, 5), slice(100, 357), slice(values.numel() - 3, values.numel() + 10)):
        assert same_bits(flat[span], values.reshape(-1)[span])
    assert torch.equal(b.reshape(-1)[3:20], low.reshape(-1)[3:20])
    assert list(tmp_path.iterdir()) == []  # anonymous
    f.close()
    assert f.closed


def test_a_spilled_tensor_is_only_flattened_and_sliced_by_step_one(tmp_path):
    t = SpillFile(tmp_path).write(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"reshape\(-1\)"):
        t.reshape(2, 8)
    with pytest.raises(ValueError, match="step-1 slices"):
        t.reshape(-1)[::2]
    with pytest.raises(ValueError, match="step-1 slices"):
        t[0:2]  # not flattened


def test_a_spilled_mapping_reads_each_entry_when_indexed(tmp_path):
    f = SpillFile(tmp_path)
    tensors = {"w": torch.randn(3, 4), "m": (torch.randn(2), torch.randn(2))}
    spilled = write_all(f, tensors)
    assert isinstance(spilled, Spilled) and list(spilled) == ["w", "m"] and len(spilled) == 2
    assert torch.equal(spilled["w"], tensors["w"])
    assert all(torch.equal(x, y) for x, y in zip(spilled["m"], tensors["m"]))
    assert spilled.nbytes == f.nbytes == (12 + 4) * 4
    assert source(spilled, "w").numel() == 12 and source(spilled, "none", None) is None  # unread
    assert source(tensors, "w") is tensors["w"]
    with pytest.raises(KeyError):
        source(spilled, "none")


def test_a_model_loads_spilled_weights_one_at_a_time_as_load_state_dict_does(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    weights = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    _load_weights(model, write_all(SpillFile(tmp_path), weights))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    with pytest.raises(ValueError, match="weights for another model"):
        _load_weights(model, write_all(SpillFile(tmp_path), {"0.weight": weights["0.weight"]}))
    wrong = dict(weights, **{"1.bias": torch.zeros(5)})
    with pytest.raises(ValueError, match=r"weights\['1.bias'\] has shape \(5,\)"):
        _load_weights(model, write_all(SpillFile(tmp_path), wrong))


def test_adamw_with_its_moments_on_disk_is_adamw_to_the_bit(tmp_path):
    """Steps with clipping, weight decay and a schedule: the same weights and moments as ``torch.optim.AdamW``
    over all parameters at once; between steps no moment is in memory and every gradient is freed."""
    from precsearch.probe.damage.spilled_adamw import SpilledMomentsAdamW, moments_of

    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    kw = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    plain = torch.optim.AdamW(nets[0].parameters(), **kw)
    spilled = SpilledMomentsAdamW(nets[1].parameters(), SpillFile(tmp_path), **kw)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3)) for o in (plain, spilled)]
    for step in range(5):
        x = torch.randn(4, 16)
        for net, opt, sched in zip(nets, (plain, spilled), scheds):
            net(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        assert all(p.grad is None for p in nets[1].parameters())
        assert all(set(spilled.state[p]) == {"step"} for p in nets[1].parameters())
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert same_bits(a.detach(), b.detach())
        for x, y in zip(moments_of(plain, a), moments_of(spilled, b)):
            assert same_bits(x, y.load())
    assert spilled.spill.nbytes == 2 * 4 * sum(p.numel() for p in nets[1].parameters())  # written over each step
    with pytest.raises(ValueError, match="no closure"):
        spilled.step(lambda: 0.0)
