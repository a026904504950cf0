"""Where a trial's memory saving comes from: its memory breakdown against the baseline's.

Artifacts of a trial's MLflow run:

* ``memory/breakdown.json``: the memory model's components for the target (weights, FP8 weight
  copies, master weights, moments, gradients, activations, logits, the optimizer step's FP32
  copies) for the trial and its reference run (the baseline of ``objectives.baseline_memory``),
  in bytes, and, where the probe ran on a GPU, both probes' measured peaks and resident bytes by
  step phase (:mod:`precsearch.probe.memory.phases`);
* ``memory/breakdown.png``: the target components as stacked bars, baseline beside trial.

:func:`saving_sources` is the one-line summary ``precsearch front`` prints under each policy.
"""

from __future__ import annotations

from typing import Any

from precsearch.probe.result import ProbeResult
from precsearch.tracking.figures import png_bytes

GIB = 2**30
#: Components in stacking order (static state first, then what the step adds).
COMPONENTS = ("weights", "fp8_weight_copies", "master_weights", "moments", "gradients", "activations", "logits",
              "step_transient", "fp8_head_transient")
#: What a person reads for each component. ``fp8_weight_copies`` (its name in ``breakdown.json``) holds the
#: weight copies saved for the backward, BF16 ones (autocast, FP32 parameters) in a BF16 run: "fp8" on the
#: baseline's bar would be false.
LABELS = {"weights": "weights", "fp8_weight_copies": "weight copies (BF16 or FP8)", "master_weights": "master",
          "moments": "moments", "gradients": "gradients", "activations": "activations", "logits": "logits",
          "step_transient": "step transient", "fp8_head_transient": "output layer's FP8 forward"}


def breakdown(result: ProbeResult, reference: ProbeResult) -> dict[str, Any]:
    """The trial's and the reference's components (target, predicted) and measured phases (probe, GPU)."""
    mine, base = result.target_breakdown, reference.target_breakdown
    data: dict[str, Any] = {"target_layers": result.target_layers, "unit": "bytes",
                            "target": {"trial": mine, "baseline": base,
                                       "saved": {k: base.get(k, 0) - mine.get(k, 0) for k in mine}},
                            "target_peak": {"trial": result.target_memory_bytes,
                                            "baseline": reference.target_memory_bytes,
                                            "source": result.target_memory_source}}
    if result.memory_phases or reference.memory_phases:
        data["probe_measured"] = {"trial": result.memory_phases, "baseline": reference.memory_phases,
                                  "peak": {"trial": result.peak_memory_bytes, "baseline": reference.peak_memory_bytes}}
    return data


def saving_sources(trial: dict[str, int], baseline: dict[str, int], top: int = 3) -> str:
    """The components that move memory most against the baseline, e.g. ``moments -35.1 GiB, master -11.7 GiB``."""
    moves = [(k, trial.get(k, 0) - baseline.get(k, 0)) for k in COMPONENTS if k in trial or k in baseline]
    floor = 0.005 * sum(baseline.values())  # moves under 0.5% of the baseline are noise in a summary
    moves = [m for m in sorted(moves, key=lambda m: -abs(m[1])) if m[1] and abs(m[1]) >= floor][:top]
    return ", ".join(f"{LABELS[k].split(' (')[0]} {_size(v)}" for k, v in moves)


def _size(n: int) -> str:
    """A signed size with the unit that keeps it from rounding to zero (``-0.0 MiB`` told a small model's
    reader that nothing was saved)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale / 10 * (10 if unit == "GiB" else 1):
            return f"{n / scale:+.1f} {unit}"
    return f"{n:+d} B"


def breakdown_png(data: dict[str, Any], title: str = "") -> bytes | None:
    """Stacked bars of the target's components, baseline and trial side by side (None without a breakdown).

    The components are not all alive at once (the gradients are not, at the backward), so a bar adds up
    to more than the peak: each bar's predicted peak is drawn across it as a black line, named in the legend.
    """
    trial, base = data["target"]["trial"], data["target"]["baseline"]
    if not trial or not base:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peaks = data.get("target_peak", {})
    scale, unit = (GIB, "GiB") if max(sum(base.values()), sum(trial.values())) >= GIB else (2**20, "MiB")
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    bottoms = [0.0, 0.0]
    for i, part in enumerate(COMPONENTS):
        values = [base.get(part, 0) / scale, trial.get(part, 0) / scale]
        ax.bar(["baseline", "trial"], values, bottom=bottoms, label=LABELS[part],
               color=plt.get_cmap("tab10")(i))
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for x, key in enumerate(("baseline", "trial")):
        if peaks.get(key):
            ax.hlines(peaks[key] / scale, x - 0.42, x + 0.42, color="black", linewidth=2,
                      label="predicted peak (not every part is alive at once)" if x == 0 else None)
    ax.set_ylabel(f"{unit} (memory model, target)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(f"{title} memory by component, {data['target_layers']} blocks".strip(), fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return png_bytes(fig)


def framework_breakdown(data: dict[str, Any], framework: dict[str, Any]) -> dict[str, Any]:
    """``data`` (:func:`breakdown`) with its target part replaced by a framework's run, predicted: ``framework``
    holds ``target`` (its name), ``n_layers``, ``trial_parts``, ``baseline_parts``, ``peak_bytes`` and
    ``baseline_bytes`` (:class:`~precsearch.runtime.target_memory.TargetSaving` as data). The probe's measured
    phases stay: they are what the probe measured."""
    mine, base = framework["trial_parts"], framework["baseline_parts"]
    return data | {"target_layers": framework["n_layers"],
                   "target": {"trial": mine, "baseline": base,
                              "saved": {k: base.get(k, 0) - mine.get(k, 0) for k in mine}},
                   "target_peak": {"trial": framework["peak_bytes"], "baseline": framework["baseline_bytes"],
                                   "source": f"{framework['target']}'s run, predicted with its rules"}}


def log_memory_breakdown(tracker: Any, run_id: str, trial: Any, result: ProbeResult, reference: ProbeResult,
                         framework: dict[str, Any] | None = None) -> None:
    """Log ``memory/breakdown.json`` and ``.png`` on the trial's run; keep the summary for ``precsearch front``.
    ``framework``: the study's framework target's run (:func:`framework_breakdown`), shown instead of precsearch's
    own at the target model."""
    import json

    data = breakdown(result, reference)
    if framework is not None:
        data = framework_breakdown(data, framework)
    trial.set_user_attr("memory_sources", saving_sources(data["target"]["trial"], data["target"]["baseline"]))
    tracker.log_bytes(run_id, json.dumps(data, indent=1).encode(), "memory/breakdown.json")
    if (png := breakdown_png(data, f"trial {trial.number}:")) is not None:
        tracker.log_bytes(run_id, png, "memory/breakdown.png")
