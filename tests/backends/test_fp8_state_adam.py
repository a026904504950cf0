"""FP8StateAdamW on the CPU (its eager path): AdamW's update, TE's storage rules, a state that survives save/load.

The GPU test (``test_gpu_fp8_state_adam.py``) compares the Triton kernels with this eager path and with TE's
``FusedAdam``; here the eager path itself is checked against ``torch.optim.AdamW`` and against the storage
rules written out independently (E4M3 per-tensor scale = 448 / amax, TE's remainder split).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

from _starve import starve

from precsearch.backends.fp8_state_adam import (MIN_AMAX, FP8StateAdamW, applies, dequantize_state, join_master,
                                                quantize_state, split_master)

OPTS = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _params(dtype: torch.dtype, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype)) for shape in ((37, 19), (256,), (3, 5, 7))]


def _grads(params, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * 10.0 ** torch.randint(-4, 1, p.shape, generator=g)).to(p.dtype)


def _lockstep(a, lead, b, follow, steps: int) -> None:
    """Step ``a`` on ``lead`` and ``b`` on ``follow`` with the same gradients (cast to each one's dtype)."""
    for step in range(steps):
        _grads(lead, step)
        for p, q in zip(lead, follow):
            q.grad = p.grad.to(q.dtype)
        a.step()
        b.step()


def _train(opt, params, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        _grads(params, step)
        opt.step()


def test_fp32_states_are_torch_adamw():
    ours, theirs = _params(torch.float32), _params(torch.float32)
    a = FP8StateAdamW(ours, master="none", exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32", **OPTS)
    _lockstep(a, ours, torch.optim.AdamW(theirs, **OPTS), theirs, 5)
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_bf16_parameters_follow_their_fp32_master():
    """With a whole FP32 master the BF16 parameter is the master rounded to nearest, and the master is AdamW's."""
    bf16 = _params(torch.bfloat16)
    fp32 = [torch.nn.Parameter(p.detach().float()) for p in bf16]
    a = FP8StateAdamW(bf16, master="fp32", exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32", **OPTS)
    _lockstep(a, bf16, torch.optim.AdamW(fp32, **OPTS), fp32, 4)
    for p, q in zip(bf16, fp32):
        torch.testing.assert_close(a.state[p]["master_param"], q.detach(), rtol=1e-6, atol=1e-7)
        assert torch.equal(p.detach(), a.state[p]["master_param"].to(torch.bfloat16))


def test_remainders_keep_the_same_fp32_master_bit_for_bit():
    whole, split = _params(torch.bfloat16), _params(torch.bfloat16)
    a = FP8StateAdamW(whole, master="fp32", **OPTS)
    b = FP8StateAdamW(split, master="remainders", **OPTS)
    _lockstep(a, whole, b, split, 4)
    for p, q in zip(whole, split):
        joined = join_master(q.detach(), b.state[q]["param_remainders"])
        assert torch.equal(joined.view(torch.int32), a.state[p]["master_param"].view(torch.int32))
        assert b.state[q]["param_remainders"].dtype == torch.int16


def test_remainder_split_is_tes_rule():
    """High half rounded up exactly when the low half's top bit is set (TE's multi_tensor_adam_param_remainder)."""
    w = torch.randn(10_000, generator=torch.Generator().manual_seed(1)) * 10.0 ** torch.randint(-6, 4, (10_000,))
    high, low = split_master(w)
    bits = w.view(torch.int32).tolist()
    expected_high = [((b >> 16) + (1 if b & 0x8000 else 0)) & 0xFFFF for b in bits]
    assert [h & 0xFFFF for h in high.view(torch.int16).tolist()] == expected_high
    assert [x & 0xFFFF for x in low.tolist()] == [b & 0xFFFF for b in bits]
    assert torch.equal(join_master(high, low).view(torch.int32), w.view(torch.int32))
    # rounded to nearest: the BF16 half is within half a BF16 ulp of the FP32 value
    assert ((high.float() - w).abs() <= w.abs() * 2.0 ** -8 + 1e-38).all()


def _first_step(**storage):
    """One step of BF16 parameters with remainders and the given moment storages; (optimizer, [(param, grad)])."""
    params = _params(torch.bfloat16)
    opt = FP8StateAdamW(params, master="remainders", **storage, **OPTS)
    _grads(params, 0)
    grads = [(p, p.grad.float()) for p in params]
    opt.step()
    return opt, grads


def test_fp8_moments_are_e4m3_with_tes_per_tensor_scale():
    opt, grads = _first_step(exp_avg_dtype="fp8", exp_avg_sq_dtype="fp8")
    b1, b2 = OPTS["betas"]
    for p, g in grads:
        state = opt.state[p]
        for name, exact in (("exp_avg", (1 - b1) * g), ("exp_avg_sq", (1 - b2) * g * g)):
            stored = state[name]
            assert stored.dtype == torch.float8_e4m3fn and stored.element_size() == 1
            amax = exact.abs().max()
            torch.testing.assert_close(state[f"{name}_scale_inv"], (amax / 448).reshape(1), rtol=1e-6, atol=0)
            got = stored.float() * state[f"{name}_scale_inv"]
            assert got.abs().max() == pytest.approx(float(amax), rel=1e-6)  # the amax maps to 448 exactly
            normal = exact.abs() >= amax / 448 * 2.0 ** -6  # E4M3 normals: 3 mantissa bits, half-ulp 2^-4
            assert ((got - exact).abs()[normal] <= exact.abs()[normal] * 2.0 ** -4 * (1 + 1e-6)).all()


def test_an_all_zero_moment_stays_finite_with_scale_one():
    """TE divides by a zero amax there (scale 1/0); a parameter without gradient signal must not turn NaN."""
    p = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    opt = FP8StateAdamW([p], master="fp32", **OPTS)
    p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.isfinite(p).all()
    assert opt.state[p]["exp_avg_scale_inv"].item() == 1.0
    assert torch.equal(opt.state[p]["exp_avg"].float(), torch.zeros(64))


@pytest.mark.parametrize("master", ["fp32", "remainders", "none"])
@pytest.mark.parametrize("storage", ["fp8_block", "fp8"])
def test_a_first_moment_that_shrinks_below_fp32s_normal_range_is_stored_as_zeros_not_nan(master, storage):
    """Without the MIN_AMAX rule the weight turned NaN at step 781 (every master): an FP8 moment that decays by
    beta1 a step reaches amax < 1.3e-36, where ``448 / amax`` overflows and a zero code times inf is NaN."""
    p = torch.nn.Parameter(torch.randn(4, 128).to(torch.bfloat16))
    opt = FP8StateAdamW([p], master=master, exp_avg_dtype=storage, exp_avg_sq_dtype=storage, lr=2e-3,
                        betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    assert starve(opt, p, 900) is None
    state = opt.state[p]
    assert not state["exp_avg"].float().any()  # the first moment is below 5.3e-36: stored as zeros ...
    assert (state["exp_avg_scale_inv"] == 1.0).all()  # ... with scale 1
    assert state["exp_avg_sq"].float().any()  # the second moment (its root, 0.975x a step) is still held


@pytest.mark.parametrize("storage", ["fp8_block", "fp8"])
def test_an_amax_below_min_amax_gives_zero_codes_and_scale_one(storage):
    """Each side of the threshold: just above it the amax still maps to 448; below it, zeros with scale 1."""
    x = torch.zeros(256)
    x[3] = MIN_AMAX
    codes, scale_inv = quantize_state(x, storage)
    assert torch.isfinite(scale_inv).all() and codes.float().abs().max() == 448.0
    assert dequantize_state(codes, scale_inv, storage)[3] == pytest.approx(MIN_AMAX, rel=1e-6)
    for tiny in (MIN_AMAX / 2, 1e-37, 1e-40, 1e-45):
        x[3] = tiny
        codes, scale_inv = quantize_state(x, storage)
        assert not codes.float().any() and (scale_inv == 1.0).all(), tiny


def test_mixed_storages_keep_their_dtypes():
    params = _params(torch.bfloat16)
    opt = FP8StateAdamW(params, master="none", exp_avg_dtype="fp8", exp_avg_sq_dtype="bf16", **OPTS)
    _train(opt, params, 2)
    for p in params:
        assert opt.state[p]["exp_avg"].dtype == torch.float8_e4m3fn
        assert opt.state[p]["exp_avg_sq"].dtype == torch.bfloat16
        assert "exp_avg_sq_scale_inv" not in opt.state[p] and "master_param" not in opt.state[p]


def test_fp32_parameters_get_no_master():
    params = _params(torch.float32)
    opt = FP8StateAdamW(params, master="remainders", **OPTS)
    assert all(set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq", "exp_avg_scale_inv", "exp_avg_sq_scale_inv"}
               for p in params)


def test_save_and_load_continue_the_same_run():
    """A state saved after 3 steps and loaded into a new optimizer gives the uninterrupted run's parameters."""
    straight = _params(torch.bfloat16)
    opt = FP8StateAdamW(straight, master="remainders", **OPTS)
    _train(opt, straight, 6)

    first = _params(torch.bfloat16)
    opt1 = FP8StateAdamW(first, master="remainders", **OPTS)
    _train(opt1, first, 3)
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in first], "opt": opt1.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt2 = FP8StateAdamW(resumed, master="remainders", **OPTS)
    opt2.load_state_dict(saved["opt"])
    for p in resumed:
        assert opt2.state[p]["exp_avg"].dtype == torch.float8_e4m3fn
        assert opt2.state[p]["param_remainders"].dtype == torch.int16
        assert opt2.state[p]["step"] == 3
    _train(opt2, resumed, 3, start=3)
    for a, b in zip(straight, resumed):
        assert torch.equal(a.detach(), b.detach())


def test_state_dict_is_a_copyable_snapshot():
    params = _params(torch.bfloat16)
    opt = FP8StateAdamW(params, **OPTS)
    snapshot = copy.deepcopy(opt.state_dict())
    _train(opt, params, 1)
    assert all(s["step"] == 0 for s in snapshot["state"].values())


@pytest.mark.parametrize("field, value", [("master", "fp16"), ("exp_avg_dtype", "fp16"),
                                          ("exp_avg_sq_dtype", "e5m2")])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"{field} '{value}'; valid: "):
        FP8StateAdamW(_params(torch.bfloat16), **{field: value})


@pytest.mark.parametrize("first, second, master, fp8_weights, expected", [
    ("fp8", "fp8", "remainders", False, True),
    ("fp8", "bf16", "fp32", False, True),
    ("fp32", "fp8", "none", False, True),
    ("fp8_block", "fp8_block", "remainders", False, True),
    ("bf16", "fp8_block", "fp32", False, True),
    ("bf16", "bf16", "fp32", False, False),  # FusedAdam unscales BF16 moments inside its kernel already
    ("fp8", "fp8", "fp16", False, False),  # FP16 masters: FusedAdam
    ("fp8", "fp8", "fp32", True, False),  # FP8 parameters: FusedAdam's FP8-parameter kernel
])
def test_which_knobs_it_steps(first, second, master, fp8_weights, expected):
    assert applies(first, second, master, fp8_weights) is expected


def test_fp8_block_moments_have_a_scale_per_128_elements_and_keep_the_root_of_v():
    opt, grads = _first_step(exp_avg_dtype="fp8_block", exp_avg_sq_dtype="fp8_block")
    b1, b2 = OPTS["betas"]
    for p, g in grads:
        state = opt.state[p]
        for name, kept in (("exp_avg", (1 - b1) * g), ("exp_avg_sq", ((1 - b2) * g * g).sqrt())):
            scale_inv = state[f"{name}_scale_inv"]
            assert scale_inv.shape == (-(-p.numel() // 128),) and state[name].dtype == torch.float8_e4m3fn
            blocks = torch.nn.functional.pad(kept.reshape(-1), (0, -p.numel() % 128)).reshape(-1, 128)
            amax = blocks.abs().amax(dim=1)
            expected = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
            torch.testing.assert_close(scale_inv, expected, rtol=1e-6, atol=0)
            got = (torch.nn.functional.pad(state[name].float().reshape(-1), (0, -p.numel() % 128)).reshape(-1, 128)
                   * scale_inv[:, None])
            normal = blocks.abs() >= amax[:, None] / 448 * 2.0 ** -6
            assert ((got - blocks).abs()[normal] <= blocks.abs()[normal] * 2.0 ** -4 * (1 + 1e-6)).all()


def test_a_per_tensor_fp8_second_moment_loses_small_gradients_and_blows_up_where_fp8_block_does_not():
    """The divergence of every ``fp8`` trial on the 8B probe, in miniature: one block of gradients 1, one of
    1e-4. Per tensor, E4M3 keeps ~2^17 of range below the amax: v = 1e-8 (x 0.05) of the small block reads back
    0, so when its gradient is 0 the next step the update is m / eps. Per block, each keeps its own scale."""
    updates = {}
    for storage in ("fp8", "fp8_block"):
        p = torch.nn.Parameter(torch.zeros(256))
        opt = FP8StateAdamW([p], master="none", exp_avg_dtype=storage, exp_avg_sq_dtype=storage, lr=1e-3,
                            betas=(0.9, 0.95), weight_decay=0.0)
        p.grad = torch.cat([torch.ones(128), torch.full((128,), 1e-4)])
        opt.step()
        before = p.detach().clone()
        p.grad = torch.cat([torch.ones(128), torch.zeros(128)])
        opt.step()
        updates[storage] = (p.detach() - before)[128:].abs().max().item()
    assert updates["fp8"] > 100 * 1e-3  # m / eps: a step a hundred learning rates long
    assert updates["fp8_block"] < 2 * 1e-3  # Adam's normal step: about lr


def test_the_damage_reading_keeps_fp8_block_moments_as_the_optimizer_does():
    """The fixed-state reading rounds a policy's moments as FP8StateAdamW stores them, chunk by chunk."""
    from precsearch.backends.fp8_state_adam import dequantize_state, quantize_state
    from precsearch.probe.damage.update import Storage

    x = torch.randn(1000, generator=torch.Generator().manual_seed(3)).abs() * 10.0 ** torch.randint(-8, 0, (1000,))
    for root in (False, True):
        optimizer = dequantize_state(*quantize_state(x, "fp8_block", root=root), "fp8_block", root=root)
        whole = Storage("fp8_block", root=root)(x)
        chunks = torch.cat([Storage("fp8_block", root=root)(c) for c in x.split(256)])
        assert torch.equal(whole, optimizer) and torch.equal(chunks, optimizer)


@pytest.mark.parametrize("knobs, master, storage", [
    (dict(master_weights=True, master_dtype="remainders", moment_dtype="fp8_block"), "remainders",
     ("fp8_block", "fp8_block")),
    (dict(master_weights=True, moment_dtype="bf16", exp_avg_dtype="fp8"), "fp32", ("fp8", "bf16")),
])
def test_the_te_backend_steps_fp8_moments_with_it(knobs, master, storage):
    """The probe's (and ``policy.build_optimizer``'s) optimizer for FP8 moments; building it needs no GPU."""
    from precsearch.backends.te import TEBackend
    from precsearch.policy import MemoryKnobs

    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    opt = TEBackend().build_optimizer(model, MemoryKnobs(**knobs), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    assert isinstance(opt, FP8StateAdamW)
    assert (opt.master, opt.storage["exp_avg"], opt.storage["exp_avg_sq"]) == (master, *storage)


def test_parameters_swapped_in_before_the_first_step_train_as_if_built_on_them():
    """Accelerate's Transformer Engine path (``Accelerator._prepare_te``) points ``param_groups`` at new
    ``te.Linear`` weights in ``prepare()`` and leaves ``state`` keyed by the old ones: without adopting them the
    first step found no state (KeyError), and the old states stayed alive beside the new."""
    built_on, swapped, reference = _params(torch.bfloat16), _params(torch.bfloat16), _params(torch.bfloat16)
    a = FP8StateAdamW(built_on, master="remainders", exp_avg_dtype="fp8_block", exp_avg_sq_dtype="fp8_block", **OPTS)
    a.param_groups[0]["params"] = swapped  # as _prepare_te does: same values, new Parameters
    b = FP8StateAdamW(reference, master="remainders", exp_avg_dtype="fp8_block", exp_avg_sq_dtype="fp8_block",
                      **OPTS)
    _lockstep(a, swapped, b, reference, 3)
    assert set(a.state) == set(swapped)  # the replaced parameters' states are gone
    for x, y in zip(swapped, reference):
        assert torch.equal(x, y)
