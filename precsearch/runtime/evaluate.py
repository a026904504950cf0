"""Evaluating a fixed set of policies side by side (benchmarks and full-depth checks).

The study scores one policy per trial; benchmarks need many policies measured
in one run on one shape, with the same data, seed and steps, so that their
ratios can be compared. :func:`evaluate_policies` does that and never stops at
a policy that runs out of memory: the row says so.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from precsearch.arch.config import ModelConfig
from precsearch.backends.base import Backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.probe.data import TokenBatches
from precsearch.probe.runner import run_probe
from precsearch.search.scoring import DIVERGED_INSTABILITY


def front_policies(study_dir: Path, top: int | None = None) -> dict[str, Policy]:
    """The Pareto-front policies of a finished study, most memory saved first."""
    import optuna

    from precsearch.runtime.stores import open_storage
    from precsearch.runtime.workspace import Workspace
    from precsearch.search.front import trial_rows

    ws = Workspace.load(study_dir)
    study = optuna.load_study(study_name=ws.study_name, storage=open_storage(ws.storage_url))
    rows = sorted((r for r in trial_rows(study, study.user_attrs["objectives"]) if r["pareto"]),
                  key=lambda r: -r["memory_saved"])
    trials = {t.number: t for t in study.trials}
    return {f"front: trial {r['trial']}": Policy.from_dict(trials[r["trial"]].user_attrs["policy"])
            for r in rows[:top]}


def evaluate_policies(cfg: ModelConfig, probe: ProbeSection, policies: dict[str, Policy], data: TokenBatches,
                      backend: Backend, device: torch.device, baseline: str = "BF16") -> list[dict[str, Any]]:
    """Run each policy's probe on ``cfg``; rows carry peak memory, tokens/s, held-out loss and ratios.

    ``memory_saved`` and ``speedup`` are against the row named ``baseline``. ``loss_gap`` is against
    the BF16 row with the same gradient clipping (as the study pairs its references): a row named
    ``f"{baseline} (clip {c})"`` for each other clip value ``c`` must be among ``policies``.
    """
    rows = [_evaluate(name, cfg, probe, policy, data, backend, device) for name, policy in policies.items()]
    base = next(r for r in rows if r["policy"] == baseline)
    paired = {r["detail"]["clip_grad"]: r for r in rows
              if r["policy"] == baseline or r["policy"].startswith(f"{baseline} (clip ")}
    for row in rows:
        row["memory_saved"] = 1 - row["peak_gib"] / base["peak_gib"]
        row["loss_gap"] = row["eval_loss"] / paired[row["detail"]["clip_grad"]]["eval_loss"] - 1
        row["instability"] = DIVERGED_INSTABILITY if row["diverged"] else max(row["loss_gap"], 0.0)
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else 0.0
    return rows


def _evaluate(name: str, cfg: ModelConfig, probe: ProbeSection, policy: Policy, data: TokenBatches,
              backend: Backend, device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    row: dict[str, Any] = {"policy": name, "detail": policy.to_dict()}
    try:
        r = run_probe(cfg, probe, policy, data, backend, device)
    except torch.OutOfMemoryError:
        print(f"  {name}: out of memory", file=sys.stderr, flush=True)
        return row | {"peak_gib": math.nan, "memory_source": "out of memory", "tokens_per_s": 0.0,
                      "eval_loss": math.nan, "diverged": True, "predicted_gib": math.nan}
    row |= {"peak_gib": r.peak_memory_bytes / 2**30, "memory_source": r.memory_source,
            "tokens_per_s": r.tokens_per_s, "eval_loss": r.eval_loss, "diverged": r.diverged,
            "predicted_gib": r.predicted_memory["total"] / 2**30}
    print(f"  {name}: peak {row['peak_gib']:.2f} GiB, {r.tokens_per_s:.0f} tok/s, held-out loss "
          f"{r.eval_loss:.4f}", file=sys.stderr, flush=True)
    return row


def te_version() -> str | None:
    """The installed Transformer Engine version, or None (for benchmark metadata)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("transformer_engine")
    except importlib.metadata.PackageNotFoundError:
        return None


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of :func:`evaluate_policies` rows."""
    lines = [f"{'policy':44s} {'peak GiB':>9} {'saved':>7} {'pred GiB':>9} {'tok/s':>8} {'speedup':>7} "
             f"{'loss gap':>8}"]
    for r in rows:
        gap = "OOM" if r["memory_source"] == "out of memory" else (
            "diverged" if r["diverged"] else f"{100 * r['loss_gap']:+7.2f}%")
        lines.append(f"{r['policy']:44s} {r['peak_gib']:9.2f} {100 * r['memory_saved']:+6.1f}% "
                     f"{r['predicted_gib']:9.2f} {r['tokens_per_s']:8.0f} {r['speedup']:6.2f}x {gap:>8}")
    return "\n".join(lines)
