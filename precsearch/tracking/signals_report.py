"""Early-warning signals of one trial, as MLflow metrics, a JSON artifact and a plot.

What a reviewer finds on a trial's run (see :mod:`precsearch.probe.measure.signals` and :mod:`precsearch.probe.measure.risk`):

* metrics ``signal_<name>`` for every measured signal of the policy, ``signal_ref_<name>`` for its BF16
  reference, ``risk_score`` and ``risk_<name>`` (each signal's excess over BF16, in units);
* tag ``risk_missing``: signals the score could not read (absent when none);
* artifacts ``signals/signals.json`` (policy and reference :class:`Signals`) and ``signals/signals.png``
  (one panel per signal over steps, policy against reference).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from precsearch.probe.measure.risk import Risk, risk_score, seed_spread
from precsearch.probe.measure.signals import Signals
from precsearch.tracking.figures import png_bytes

SCALARS = ("amax_growth", "kurtosis", "kurtosis_growth", "alignment", "alignment_max", "alignment_growth",
           "attention_logit", "attention_logit_growth", "grad_norm_trend")
"""The :class:`Signals` fields logged as ``signal_*`` metrics."""

PANELS = (("amax", "amax of the fastest-growing tensor", True),
          ("kurtosis", "block-output kurtosis (max over blocks)", True),
          ("alignment", "gate/up mean |cos| (max over blocks)", False),
          ("attention_logit", "max attention logit (max over blocks)", False),
          ("grad_norm", "grad norm", True))
"""Plot panels: series name, title, log y axis."""


def signals_metrics(policy: Signals, reference: Signals | None,
                    spread: dict[str, float] | None = None) -> dict[str, float]:
    """``signal_*`` (and with a reference ``signal_ref_*``, ``risk_score``, ``risk_*``); NaN signals left out.

    ``spread``: the BF16 seeds' spread per signal (:func:`~precsearch.probe.measure.risk.seed_spread`).
    """
    metrics = _scalars(policy, "signal_")
    if reference is not None:
        metrics |= _scalars(reference, "signal_ref_")
        risk = risk_score(policy, reference, spread=spread)
        metrics["risk_score"] = risk.score
        metrics |= {f"risk_{name}": value for name, value in risk.excess.items()}
    return metrics


def signals_tags(policy: Signals, reference: Signals | None,
                 spread: dict[str, float] | None = None) -> dict[str, str]:
    """``risk_missing`` when the score had to leave signals out; where the worst amax growth is."""
    tags = {"signal_amax_growth_at": policy.amax_growth_at} if policy.amax_growth_at else {}
    risk: Risk | None = risk_score(policy, reference, spread=spread) if reference is not None else None
    if risk is not None and risk.missing:
        tags["risk_missing"] = ",".join(risk.missing)
    return tags


def signals_artifacts(policy: Signals, reference: Signals | None) -> dict[str, str]:
    """``signals/signals.json``: both runs' signals, series included."""
    data = {"policy": policy.to_dict(), "reference": reference.to_dict() if reference is not None else None}
    return {"signals/signals.json": json.dumps(data, indent=1)}


def _scalars(signals: Signals, prefix: str) -> dict[str, float]:
    values = {name: float(getattr(signals, name)) for name in SCALARS}
    return {prefix + name: value for name, value in values.items() if math.isfinite(value)}


def signals_plot(policy: Signals, reference: Signals | None, title: str = "",
                 spread: dict[str, float] | None = None) -> bytes:
    """A PNG with one panel per signal over steps, the policy against its BF16 reference (dashed); the
    title's risk is the one the metrics report (same ``spread``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(3.2 * len(PANELS), 3.0), dpi=110)
    for ax, (name, heading, log) in zip(axes, PANELS):
        _panel(ax, name, policy, reference)
        ax.set_title(heading, fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(which="both", labelsize=7)
        if log and ax.has_data():
            ax.set_yscale("log")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    risk = ("no reference" if reference is None
            else f"risk {risk_score(policy, reference, spread=spread).score:.2f}")
    fig.suptitle(f"{title} early-warning signals ({risk})".strip(), fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def _panel(ax, name: str, policy: Signals, reference: Signals | None) -> None:
    for signals, label, style in ((policy, "policy", "-"), (reference, "BF16 reference", "--")):
        points = [(s, v) for s, v in (signals.series.get(name, []) if signals else []) if math.isfinite(v)]
        if points:
            ax.plot(*zip(*points), style, label=label, linewidth=1.2)
    if not ax.has_data():
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, fontsize=8)


def save_signals_plot(policy: Signals, reference: Signals | None, path: Path, title: str = "") -> Path:
    """Write :func:`signals_plot` to ``path`` (parents created); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(signals_plot(policy, reference, title))
    return path


def trial_signals(policy: dict | None, reference: dict | None, seeds: list[dict | None] = ()
                  ) -> tuple[dict[str, float], dict[str, str], dict[str, str], bytes | None]:
    """What a trial's MLflow run gets from :attr:`ProbeResult.signals` dicts (the policy's, its paired
    reference's, every reference seed's; any may be None): ``(metrics, tags, artifacts, plot PNG or
    None)``; all empty without the policy's signals."""
    if policy is None:
        return {}, {}, {}, None
    mine = Signals.from_dict(policy)
    ref = Signals.from_dict(reference) if reference is not None else None
    spread = seed_spread([Signals.from_dict(s) for s in seeds if s is not None])
    return (signals_metrics(mine, ref, spread), signals_tags(mine, ref, spread), signals_artifacts(mine, ref),
            signals_plot(mine, ref, spread=spread))
