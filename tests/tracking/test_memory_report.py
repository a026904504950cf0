"""The per-trial memory breakdown: its table, its figure and the front's one-line summary.

What would be wrong if these failed: the front would credit a saving to the wrong component (FP8
compute instead of the optimizer moments), or the MLflow artifact would lack the baseline.
"""

from __future__ import annotations

from precsearch.arch.units import unit_names
from precsearch.policy import MemoryKnobs
from precsearch.precision import Precision
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.model.llama3 import PRESETS
from precsearch.probe.memory.phases import PhaseMemory
from precsearch.probe.result import ProbeResult
from precsearch.search.front import format_table
from precsearch.tracking.memory_report import breakdown, breakdown_png, saving_sources

import torch

CFG = PRESETS["llama3-8b"].with_overrides(n_layers=4)
GIB = 2**30


def _result(memory: MemoryKnobs, fp8: bool) -> ProbeResult:
    precisions = {n: Precision.FP8_DELAYED for n in unit_names(CFG) if n != "output_layer"} if fp8 else {}
    m = predict_peak(CFG, precisions, seq_len=4096, micro_batch=1, param_dtype="bf16", memory=memory)
    return ProbeResult(target_breakdown=m.components(), target_memory_bytes=m.total, target_layers=CFG.n_layers)


def test_the_saving_is_credited_to_the_moments_and_master_not_to_fp8():
    base = _result(MemoryKnobs(master_weights=True, moment_dtype="fp32"), fp8=False)
    trial = _result(MemoryKnobs(master_weights=True, moment_dtype="fp8", master_dtype="remainders"), fp8=True)
    data = breakdown(trial, base)
    n = CFG.num_params()
    assert data["target"]["saved"]["moments"] == 6 * n and data["target"]["saved"]["master_weights"] == 2 * n
    line = saving_sources(data["target"]["trial"], data["target"]["baseline"], top=5)
    assert line.startswith("moments -") and "master -" in line
    assert "step transient" not in line  # FP8StateAdamW steps FP8 moments without FusedAdam's FP32 copies
    assert "weight copies +" in line and "fp8 weight" not in line  # FP8 compute costs memory: its weight copies


def test_breakdown_png_is_a_png_and_none_without_a_breakdown():
    base = _result(MemoryKnobs(master_weights=True, moment_dtype="fp32"), fp8=False)
    png = breakdown_png(breakdown(_result(MemoryKnobs(), fp8=True), base))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert breakdown_png(breakdown(ProbeResult(), base)) is None


def test_front_prints_the_summary_after_its_policy_on_the_same_row():
    row = {"trial": 3, "memory_saved": 0.38, "instability": 0.001, "loss_gap": 0.001, "noise_floor": float("nan"),
           "gap_in_noise": float("nan"), "tokens_per_s": 12000.0, "fidelity_steps": 100, "diverged": False,
           "policy": "fp8", "memory_sources": "moments -35.1 GiB, master -11.7 GiB"}
    lines = format_table([row]).splitlines()
    assert len(lines) == 4 and lines[-1].endswith("fp8  [saved from: moments -35.1 GiB, master -11.7 GiB]")
    assert "saved from" not in format_table([{**row, "memory_sources": ""}])


def test_phase_memory_records_nothing_on_a_cpu():
    phases = PhaseMemory(torch.device("cpu"))
    phases.mark("forward")
    assert phases.to_dict() == {} and phases.overall_peak() == 0


def test_small_models_are_summarised_in_mib_and_noise_is_left_out():
    base = {"moments": 3 * 2**20, "weights": 200 * 2**20, "activations": 100 * 2**20}
    trial = {"moments": 1 * 2**20, "weights": 200 * 2**20, "activations": 99.9 * 2**20}
    assert saving_sources(trial, base) == "moments -2.0 MiB"  # 0.1 MiB of activations is under 0.5% of 303 MiB


def test_a_small_saving_is_never_shown_as_zero():
    """``[saved from: activations -0.0 MiB]`` under a 1.77% saving read as "saved from nothing"."""
    base = {"weights": 3 * 2**20, "activations": 4 * 2**20}
    trial = {"weights": 3 * 2**20, "activations": 4 * 2**20 - 40 * 2**10}
    line = saving_sources(trial, base)
    assert line == "activations -40.0 KiB", line
    assert saving_sources({"moments": 3 * GIB}, {"moments": 5 * GIB}) == "moments -2.0 GiB"
    assert saving_sources({"moments": 0}, {"moments": 300 * 2**20}) == "moments -300.0 MiB"


def test_the_bf16_bar_is_not_labelled_fp8():
    """The baseline's weight copies are BF16 autocast copies; a legend entry "fp8 weight copies" on its bar
    told the reader the BF16 run held FP8 copies."""
    import matplotlib.pyplot as plt
    from unittest import mock

    base = _result(MemoryKnobs(), fp8=False)
    labels = []
    real_bar = plt.Axes.bar

    def bar(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return real_bar(self, *args, **kwargs)

    with mock.patch.object(plt.Axes, "bar", bar):
        breakdown_png(breakdown(_result(MemoryKnobs(), fp8=True), base))
    assert "weight copies (BF16 or FP8)" in labels and not any(str(label).lower().startswith("fp8") for label in labels)


def test_the_bars_show_each_predicted_peak_in_a_unit_that_fits():
    """A bar stacks every component, more than the peak (the gradients are not alive at the backward):
    without the peak drawn, the bar read as the memory the trial needs; a 40 MiB probe read as 0.040 GiB."""
    import matplotlib.pyplot as plt
    from unittest import mock

    small = ProbeResult(target_breakdown={"weights": 3 * 2**20, "gradients": 3 * 2**20, "activations": 30 * 2**20},
                        target_memory_bytes=33 * 2**20, target_layers=4)
    lines, labels = [], []
    real_hlines, real_ylabel = plt.Axes.hlines, plt.Axes.set_ylabel

    def hlines(self, y, *args, **kwargs):
        lines.append(y)
        return real_hlines(self, y, *args, **kwargs)

    def set_ylabel(self, text, *args, **kwargs):
        labels.append(text)
        return real_ylabel(self, text, *args, **kwargs)

    with mock.patch.object(plt.Axes, "hlines", hlines), mock.patch.object(plt.Axes, "set_ylabel", set_ylabel):
        breakdown_png(breakdown(small, small))
    assert lines == [33.0, 33.0] and labels[0].startswith("MiB")
