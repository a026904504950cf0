"""Print the FP8 diagnosis of a diverging policy: delayed scaling with stale weight scales at a hot lr.

The probe is the ``cpu_smoke`` shape (2 blocks, 64 wide) trained at a constant
lr of 0.3 with no lr warm-up. Adam's first update moves every weight by about
the lr, while a delayed-scaling weight scale still fits the initial weights
(amax about 0.1): at step 1 most of every delayed-scaled weight saturates.
Three policies run side by side on the same data and seed: BF16, FP8 current
scaling and FP8 delayed scaling (history 1, most recent) on every Linear;
statistics are collected every step. It runs on the emulated backend (CPU)
and, where CUDA and Transformer Engine import, on the ``te`` backend too.

    python scripts/diagnose_example.py [--out DIR] [--steps 25]
    # on the H200 (device tool):
    PYTHONPATH=/tmp/site:$PWD python3 scripts/diagnose_example.py --out $OUT

Writes ``diagnose_example.json`` (each run's outcome, diagnosis and the rows of
its first bad step) and one heatmap PNG per FP8 run to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy, Rule
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.measure.diagnostics import DiagnosticsConfig, FirstBad
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.runner import run_probe
from precsearch.tracking.diagnostics_report import diagnostics_heatmap

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
POLICIES = {"bf16": None, "fp8_current": Precision.FP8_CURRENT, "fp8_delayed": Precision.FP8_DELAYED}


def policy(precision: Precision | None) -> Policy:
    rules = () if precision is None else (Rule(name="all", modules=("*",), precision=precision),)
    recipe = LayerRecipe(amax_history_len=1, amax_compute_algo="most_recent")
    return Policy(rules=rules, recipe=recipe, warmup_steps=0, clip_grad=None)


def targets() -> list[tuple[str, torch.device]]:
    """(backend, device) pairs that run here."""
    found = [("emulated", torch.device("cpu"))]
    if torch.cuda.is_available():
        from precsearch.backends.capability import te_import_error

        if te_import_error() is None:
            found.append(("te", torch.device("cuda")))
        else:
            print(f"te: skipped ({te_import_error()})")
    return found


def run(backend_name: str, device: torch.device, steps: int, out: Path | None) -> list[dict]:
    torch.manual_seed(0)
    data = TokenBatches(load_tokens("stdlib", max_tokens=400_000, vocab_size=CFG.vocab_size, seed=0),
                        seq_len=32, micro_batch=4, seed=0, eval_batches=1)
    probe = ProbeSection(steps=steps, micro_batch=4, seq_len=32, lr=0.3, schedule="constant", lr_warmup_steps=0,
                         device=device.type)
    records = []
    for label, precision in POLICIES.items():
        backend = get_backend(backend_name, device)
        result = run_probe(CFG, probe, policy(precision), data, backend, device,
                           diagnostics=DiagnosticsConfig(every=1))
        records.append(_report(backend_name, label, result))
        if out is not None and (png := diagnostics_heatmap(result)) is not None:
            (out / f"heatmap_{backend_name}_{label}.png").write_bytes(png)
    return records


def _report(backend: str, label: str, result) -> dict:
    head = f"[{backend}] {label:12s}"
    if result.diverged:
        print(f"{head} DIVERGED at step {result.diverged_step}: {result.reason}")
    else:
        print(f"{head} finished {len(result.losses)} steps, eval loss {result.eval_loss:.3f}")
    peak = max((r for r in result.layer_stats), key=lambda r: r["overflow"], default=None)
    if peak is not None:
        print(f"{'':17s}max overflow {100 * peak['overflow']:.1f}% ({peak['layer']} {peak['role']} "
              f"step {peak['step']}); losses {[round(v, 2) for v in result.losses[:8]]}")
    worst = []
    if result.first_bad is not None:
        bad = FirstBad(**result.first_bad)
        worst = sorted((r for r in result.layer_stats if r["step"] == bad.step),
                       key=lambda r: -r["overflow"])[:6]
        print(f"{'':17s}{bad.describe()}; the most saturated operands at that step:")
        for r in worst:
            print(f"{'':19s}{r['layer']:34s} {r['role']:11s} overflow {100 * r['overflow']:5.1f}%  "
                  f"amax {r['amax']:.4g}  scale {r['scale'] if r['scale'] is None else round(r['scale'], 1)}")
    return {"backend": backend, "policy": label, "diverged": result.diverged, "diverged_step": result.diverged_step,
            "reason": result.reason, "first_bad": result.first_bad, "losses": result.losses,
            "first_bad_step_rows": worst,
            "max_overflow": None if peak is None else {k: peak[k] for k in ("layer", "role", "step", "overflow")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON and heatmaps")
    parser.add_argument("--steps", type=int, default=25)
    args = parser.parse_args()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}; probe {CFG.n_layers}x{CFG.dim}, lr 0.3 constant, {args.steps} steps")
    records = [r for name, device in targets() for r in run(name, device, args.steps, args.out)]
    if args.out is not None:
        clean = json.loads(json.dumps(records, default=str), parse_constant=lambda c: None)
        (args.out / "diagnose_example.json").write_text(json.dumps(clean, indent=1))
    return 0 if all(math.isfinite(r["losses"][0]) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
