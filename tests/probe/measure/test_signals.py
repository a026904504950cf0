"""Early-warning signals (:mod:`precsearch.probe.measure.signals`, :mod:`precsearch.probe.measure.signal_recorder`)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from precsearch.probe.measure.signal_recorder import SignalRecorder
from precsearch.probe.measure.signals import (Signals, gate_up_alignment, grad_norm_trend, slope, summarise, tail, token_kurtosis,
                                       trend)

LN2 = math.log(2)


# amax growth ---------------------------------------------------------------------------------------------

def test_amax_doubling_every_100_steps_grows_ln2_and_names_the_tensor():
    """The growth is a rate in ln units per 100 steps; a flat tensor beside it must not be named."""
    history = {"amax": {"a:input": {s: 3.0 * 2 ** (s / 100) for s in range(0, 501, 10)},
                        "b:input": {s: 5.0 for s in range(0, 501, 10)}}}
    signals = summarise(history)
    assert signals.amax_growth == pytest.approx(LN2, rel=1e-9)
    assert signals.amax_growth_at == "a:input"
    assert signals.series["amax"][0] == (0, 3.0)


def test_amax_growth_ignores_the_first_half():
    """Early descent moves every statistic; a tensor flat after step 250 must read ~0, not the early rise."""
    points = [(s, 2 ** (s / 50) if s < 250 else 32.0) for s in range(0, 501, 10)]
    assert slope(tail(points, 0.5), log=True) == pytest.approx(0.0, abs=1e-12)
    assert slope(points, log=True) > 0.5  # over the whole run the transient would dominate


def test_layer_stats_rows_feed_the_amax_history():
    recorder = SignalRecorder(steps=301, every=100)
    recorder.add_layer_stats([{"step": s, "layer": "l0", "role": "weight", "amax": 2 ** (s / 100)}
                              for s in (0, 100, 200, 300)])
    signals = recorder.signals()
    assert signals.fp8_amax_growth == pytest.approx(LN2) and signals.fp8_amax_growth_at == "l0:weight"
    assert math.isnan(signals.amax_growth)  # FP8 operands are kept apart: a BF16 reference has none


# kurtosis ------------------------------------------------------------------------------------------------

def test_gaussian_kurtosis_is_3():
    torch.manual_seed(0)
    assert token_kurtosis(torch.randn(4, 64, 4096)).item() == pytest.approx(3.0, abs=0.05)


def test_two_valued_tokens_have_kurtosis_1():
    """Half +1, half -1 per token: fourth moment 1 over squared variance 1, exactly."""
    x = torch.tensor([1.0, -1.0]).repeat(3, 5, 32)
    assert token_kurtosis(x).item() == pytest.approx(1.0, abs=1e-6)


def test_an_outlier_channel_raises_kurtosis_by_the_expected_amount():
    """One channel at 50 in every token among 1023 standard normals: about (a^4/n) / (a^2/n + 1)^2 = 517."""
    torch.manual_seed(0)
    x = torch.randn(2, 128, 1024)
    x[..., 7] = 50.0
    a, n = 50.0, 1024
    assert token_kurtosis(x).item() == pytest.approx((a ** 4 / n) / (a ** 2 / n + 1) ** 2, rel=0.05)


def test_kurtosis_reads_channels_last_in_any_layout_and_samples_tokens():
    """Megatron hands (T, B, D); the value must not depend on the layout, and a strided sample stays close."""
    torch.manual_seed(0)
    x = torch.randn(3, 100, 256)
    x[..., 0] = 10.0
    assert token_kurtosis(x.transpose(0, 1)).item() == pytest.approx(token_kurtosis(x).item(), rel=1e-5)
    assert token_kurtosis(x, max_tokens=50).item() == pytest.approx(token_kurtosis(x).item(), rel=0.05)


# gate/up alignment ---------------------------------------------------------------------------------------

def test_gate_rows_equal_to_up_rows_align_fully_and_orthogonal_rows_not_at_all():
    torch.manual_seed(0)
    gate = torch.randn(8, 16)
    mean, most = gate_up_alignment(torch.cat([gate, 3 * gate]))
    assert (mean.item(), most.item()) == pytest.approx((1.0, 1.0))
    eye = torch.eye(16)
    mean, most = gate_up_alignment(torch.cat([eye[:8], eye[8:]]))  # gate_j = e_j, up_j = e_{j+8}
    assert (mean.item(), most.item()) == pytest.approx((0.0, 0.0), abs=1e-7)


def test_anti_aligned_rows_count_and_half_aligned_reads_half():
    """|cos|: up = -gate amplifies just as much. Half the neurons aligned, half orthogonal: mean 0.5, max 1.

    The halves are taken in Megatron order (rows [0, ffn) gate, [ffn, 2 ffn) up); a mix-up of the
    layout (e.g. interleaved rows) would pair the wrong rows and read something else.
    """
    eye = torch.eye(8)
    gate = eye[:4]
    up = torch.cat([-eye[:2], eye[4:6]])  # neurons 0, 1 anti-aligned; 2, 3 orthogonal
    mean, most = gate_up_alignment(torch.cat([gate, up]), chunk=3)
    assert (mean.item(), most.item()) == pytest.approx((0.5, 1.0))


def test_alignment_refuses_a_weight_that_is_not_fused():
    with pytest.raises(ValueError, match="2 \\* ffn"):
        gate_up_alignment(torch.zeros(7, 4))


# grad-norm trend -----------------------------------------------------------------------------------------

def test_grad_norm_trend_reads_exponential_growth_and_shrugs_off_a_spike():
    """ln g = 0.01 s: slope 1.0 per 100 steps. One 1000x spike in the fitted half must barely move it
    (least squares would move by far more)."""
    norms = [math.exp(0.01 * s) for s in range(400)]
    assert grad_norm_trend(norms) == pytest.approx(1.0, rel=1e-9)
    spiked = list(norms)
    spiked[390] *= 1000
    assert grad_norm_trend(spiked) == pytest.approx(1.0, rel=0.02)
    least_squares = slope(tail(list(enumerate(spiked)), 0.5), log=True)
    assert abs(least_squares - 1.0) > 0.05


def test_grad_norm_trend_skips_nonfinite_and_needs_two_steps():
    # steps 0, 2, 4 with ln g = 0, 1, 2 remain: slope 0.5 per step
    assert grad_norm_trend([1.0, math.inf, math.e, math.nan, math.e ** 2], fraction=1.0) == pytest.approx(50.0)
    assert math.isnan(grad_norm_trend([1.0]))


# recorder ------------------------------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, gain: float, outlier: bool) -> None:
        super().__init__()
        self.gain, self.outlier = gain, outlier

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        y = x * self.gain
        if self.outlier:
            y = y.clone()
            y[..., 0] = 40.0
        return y, None  # Megatron returns (hidden, context)


class _Mlp(nn.Module):
    def __init__(self, fused: torch.Tensor, te: bool) -> None:
        super().__init__()
        if te:
            self.fc1_weight = nn.Parameter(fused)
        else:
            self.linear_fc1 = nn.Linear(fused.shape[1], fused.shape[0], bias=False)
            self.linear_fc1.weight.data.copy_(fused)


class _Toy(nn.Module):
    """Two decoder blocks named like Megatron's; block 1 has an outlier channel and aligned gate/up rows."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList([_Block(1.0, False), _Block(2.0, True)])
        eye = torch.eye(8)
        self.decoder.layers[0].mlp = _Mlp(torch.cat([eye[:4], eye[4:]]), te=False)
        self.decoder.layers[1].mlp = _Mlp(torch.cat([eye[:4], eye[:4]]), te=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.decoder.layers:
            x = layer(x)[0]
        return x


def test_recorder_collects_only_on_stat_steps_and_summarises_per_block():
    """Hooks must fire on stat steps only (0, 10, 19 of 20); block 1 holds the outlier and the aligned rows,
    so it must be named; the two fc1 layouts (Megatron linear_fc1, TE fc1_weight) must both be found."""
    torch.manual_seed(0)
    model, recorder = _Toy(), SignalRecorder(steps=20, every=10)
    handles = recorder.watch_blocks(model)
    for step in range(20):
        if recorder.begin_step(step):
            recorder.record_fc1_weights(model)
        model(torch.randn(2, 16, 256).requires_grad_())
        recorder.record_grad_norm(torch.tensor(float(step + 1)))
        recorder.end_step()
    for handle in handles:
        handle.remove()
    assert sorted(recorder.history["kurtosis"]["0"]) == [0, 10, 19]
    assert len(recorder.history["grad_norm"]["model"]) == 20
    signals = recorder.signals()
    assert signals.kurtosis_block == 1 and signals.kurtosis > 50
    assert signals.alignment_block == 1 and signals.alignment == pytest.approx(1.0)
    assert recorder.history["alignment"]["0"][0] == pytest.approx(0.0)
    assert recorder.history["amax"]["block.1.output"] == {0: 40.0, 10: 40.0, 19: 40.0}
    assert set(recorder.history["amax"]) == {"block.0.output", "block.1.output"}


def test_recorder_refuses_off_stat_steps_and_ignores_evaluation():
    recorder = SignalRecorder(steps=20, every=10)
    recorder.begin_step(3)
    with pytest.raises(RuntimeError, match="not a stat step"):
        recorder.record_block_output(0, torch.zeros(1, 2, 4))
    model = _Toy()
    recorder.watch_blocks(model)
    recorder.begin_step(10)
    with torch.no_grad():
        model(torch.randn(1, 4, 8))
    recorder.end_step()
    assert "kurtosis" not in recorder.history


def test_attention_logits_are_recorded_per_block():
    recorder = SignalRecorder(steps=21, every=10)
    for step, value in ((0, 2.0), (10, 4.0), (20, 6.0)):
        recorder.begin_step(step)
        q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 1, 3, 4)
        q[0, 1, 2, 0], k[0, 0, 0, 0] = value, 1.0
        recorder.record_attention(3, q, k, scale=1.0)
        recorder.end_step()
    signals = recorder.signals()
    assert (signals.attention_logit, signals.attention_logit_block) == (6.0, 3)
    assert signals.attention_logit_growth == pytest.approx(20.0)  # +2 per 10 steps over steps 10-20 (the tail)


def test_a_trend_over_too_few_steps_is_not_measured():
    """Two stat steps one step apart (a short probe's last two) must not be extrapolated to 100 steps."""
    assert math.isnan(trend([(0, 1.0), (10, 2.0), (11, 3.0)], 0.5, log=True))
    assert trend([(0, 1.0), (10, 2.0), (20, 4.0)], 0.5, log=True) == pytest.approx(100 * LN2 / 10)


def test_signals_round_trip_through_json():
    signals = Signals(amax_growth=0.5, amax_growth_at="x", kurtosis_block=2, series={"kurtosis": [(0, 3.0)]})
    back = Signals.from_dict(json.loads(json.dumps(signals.to_dict())))
    assert json.dumps(back.to_dict()) == json.dumps(signals.to_dict())  # NaN != NaN, so compare as text
    assert back.series == {"kurtosis": [(0, 3.0)]} and back.kurtosis_block == 2
    empty = SignalRecorder(steps=5).signals()
    assert math.isnan(empty.kurtosis) and empty.series == {}
