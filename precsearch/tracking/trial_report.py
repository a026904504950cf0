"""A trial's run page: the policy as a table, its memory breakdown and its loss against BF16.

Artifacts (MLflow renders ``.md`` as Markdown and shows ``.png`` inline):

* ``policy.md``: blocks x units (``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2``)
  with each unit's precision, ``output_layer`` below, then the recipe, warm-up and clipping;
* ``memory.md``: the memory model's breakdown of the trial's probe against its BF16 reference;
* ``loss_curves.png``: training loss per step of the trial and its paired BF16 reference on one
  chart (FP8 steps shaded off during the BF16 warm-up), the held-out losses in the legend.
"""

from __future__ import annotations

import math

from precsearch.arch.units import BLOCK_UNITS, OUTPUT_LAYER
from precsearch.policy import Policy
from precsearch.probe.result import ProbeResult
from precsearch.tracking.figures import png_bytes

MEMORY_PARTS = ("params", "grads", "optimizer", "master", "weight_copies", "linear_inputs", "other_activations",
                "logits", "step_transient", "head_transient", "total")
#: The two moments of a step that can hold the peak (:class:`precsearch.probe.memory.MemoryBreakdown`), each
#: with the components alive then; ``moments`` is ``optimizer`` less ``master``, so the rows add up.
PHASES = (("at the start of the backward", "backward_peak",
           ("params", "moments", "master", "weight_copies", "linear_inputs", "other_activations", "logits")),
          ("during the optimizer step", "step_peak", ("params", "grads", "moments", "master", "step_transient")))
#: The third moment, shown where a breakdown has an FP8 output layer's forward transient.
FP8_HEAD_PHASE = ("during an FP8 output layer's forward", "forward_peak",
                  ("params", "moments", "master", "weight_copies", "linear_inputs", "other_activations",
                   "head_transient"))


def policy_table(policy: Policy, n_layers: int) -> str:
    """The policy as a Markdown table of blocks x units, each cell a precision."""
    units = list(BLOCK_UNITS)
    head = "| block | " + " | ".join(u.split(".")[-1] for u in units) + " |"
    lines = [head, "|" + "---|" * (len(units) + 1)]
    for i in range(n_layers):
        cells = [policy.precision_for(f"decoder.layers.{i}.{u}", n_layers).value for u in units]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines.append(f"| {OUTPUT_LAYER} | {policy.precision_for(OUTPUT_LAYER, n_layers).value} |"
                 + " |" * (len(units) - 1))
    recipe = {k: v for k, v in policy.recipe.to_dict().items() if k != "precision"}
    lines += ["", f"FP8 recipe: {', '.join(f'{k}={v}' for k, v in recipe.items())}",
              "", f"BF16 warm-up steps: {policy.warmup_steps}; gradient clipping: {policy.clip_grad}",
              "", f"Memory: {', '.join(f'{k}={v}' for k, v in policy.memory.to_dict().items())}"]
    return "\n".join(lines) + "\n"


def memory_table(result: ProbeResult, reference: ProbeResult) -> str:
    """The predicted memory of the probe by component, trial against BF16 reference, in MiB ("" without one).

    The peak is the largest of the moments of the step (two, three with an FP8 output layer's forward), so
    one list of every component would add up to more than the peak (gradients are not alive at the
    backward): each moment gets its own table whose rows add up to its total, and the peak is the largest.
    """
    mine, ref = result.predicted_memory, reference.predicted_memory
    if not mine or not ref:
        return ""
    title = (f"Predicted peak memory of the probe by component ({result.memory_source} peak "
             f"{result.peak_memory_bytes / 2**20:.1f} MiB)")
    if not all(key in d for d in (mine, ref) for _, key, _ in PHASES):  # a breakdown without its two moments
        return "\n".join([title, ""] + _memory_rows(mine, ref, [p for p in MEMORY_PARTS if p in mine and p in ref]))
    head = any(d.get("head_transient") for d in (mine, ref)) and all("forward_peak" in d for d in (mine, ref))
    phases = (*PHASES, FP8_HEAD_PHASE) if head else PHASES
    count = ("two", "three")[len(phases) - 2]
    lines = [title, "", f"The peak is the largest of {count} moments of a training step; each table's rows add up "
             "to its total."]
    for name, key, parts in phases:
        peak = "the peak" if mine[key] >= mine["total"] else "not the peak"
        lines += ["", f"**{name[0].upper()}{name[1:]}** (trial: {peak})", ""]
        lines += _memory_rows(_with_moments(mine), _with_moments(ref), [*parts, key])
    return "\n".join(lines) + "\n"


def _with_moments(memory: dict[str, int]) -> dict[str, int]:
    return memory | {"moments": memory.get("optimizer", 0) - memory.get("master", 0)}


def _memory_rows(mine: dict[str, int], ref: dict[str, int], parts: list[str]) -> list[str]:
    lines = ["| component | trial MiB | BF16 MiB | change |", "|---|---|---|---|"]
    for part in parts:
        change = f"{100 * (mine[part] / ref[part] - 1):+.1f}%" if ref[part] else "-"
        label = f"**{part.replace('_peak', '')} total**" if part.endswith("_peak") else part
        lines.append(f"| {label} | {mine[part] / 2**20:.2f} | {ref[part] / 2**20:.2f} | {change} |")
    return lines


def loss_curves(result: ProbeResult, reference: ProbeResult, title: str = "") -> bytes:
    """A PNG of the trial's and the BF16 reference's training loss per step on one chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    # the reference dashed on top: where the two agree (BF16 warm-up) both stay visible
    for run, label, style in ((result, "trial", {"color": "tab:orange", "linewidth": 2.0}),
                              (reference, "BF16 reference", {"color": "black", "linewidth": 1.0, "linestyle": "--"})):
        points = [(s, v) for s, v in enumerate(run.losses) if math.isfinite(v)]
        held_out = f", held-out {run.eval_loss:.4f}" if math.isfinite(run.eval_loss) else ""
        if points:
            ax.plot(*zip(*points), label=f"{label}{held_out}", **style)
    warmup = result.fp8_steps.index(True) if True in result.fp8_steps else 0
    if 0 < warmup < len(result.losses):
        ax.axvspan(0, warmup, color="grey", alpha=0.12, label="BF16 warm-up")
    if result.diverged and result.diverged_step is not None:
        ax.axvline(result.diverged_step, color="black", linewidth=1, label=f"diverged at step {result.diverged_step}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{title} training loss against BF16 (same seed, data and steps)".strip(), fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)
