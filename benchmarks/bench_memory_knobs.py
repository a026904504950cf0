"""Peak memory and speed of the optimizer-state and attention precision knobs, on a plain TE Llama stack.

The model is ``bench_stack.Reference`` (``te.TransformerLayer`` blocks, BF16 parameters, untied BF16 head,
written independently of precsearch's probe); the optimizer is Transformer Engine's ``FusedAdam`` (AdamW
mode) with the knobs of each row (rows ending ``_ps``: precsearch's ``FP8StateAdamW``, the same FP8
moments in one fused pass per tensor, ``precsearch/backends/fp8_state_adam.py``), gradients clipped to 1.0,
one outer ``te.autocast`` per step.

For each row: ``max_memory_allocated`` over the whole run (``peak_gib``); per phase of the steady steps
(every step after the first), the peak inside the phase (the peak counter is reset before it) and what is
still allocated after it; what the model alone holds after construction (``weights_gib``) and what the first
step left beside it (``state_gib``: optimizer states plus any persistent TE buffers); tokens/s from the
median gap between synchronised step ends after ``--warmup-steps``.

``groups`` is how the parameters are handed to FusedAdam: ``one`` param group (as Megatron-Core and most
training scripts do) or ``split`` into groups of at most the largest parameter's size
(``precsearch.backends.te_optimizer.size_bounded_groups``). FusedAdam's ``step()`` dequantizes every
scaled state of a group (FP8 or FP16 moments, FP16 master weights, a BF16 moment beside a non-BF16 one)
into an FP32 temporary and keeps all of them until the group's kernel and re-quantization are done, so
with one group the step holds an FP32 copy of every scaled state at once.

    python benchmarks/bench_memory_knobs.py --layers 24 --seq 4096 --json /tmp/knobs.json
    python benchmarks/bench_memory_knobs.py --layers 2 --rows bf16_std fp8_m_fp8
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stack import CLIP, LR, BETAS, SEED, WEIGHT_DECAY, Reference, free_gpu, model_config, token_batches  # noqa: E402

from precsearch.backends.fp8_state_adam import FP8StateAdamW  # noqa: E402
from precsearch.backends.te_optimizer import build_optimizer, seed_master_weights  # noqa: E402
from precsearch.runtime.evaluate import te_version  # noqa: E402

GIB = 2**30


@dataclass(frozen=True)
class Row:
    """One configuration: compute precision, weight storage, optimizer states, attention."""

    fp8: bool = True
    fp8_weights: bool = False
    master: str = "fp32"  # fp32 | fp16
    remainders: bool = False
    exp_avg: str = "fp32"
    exp_avg_sq: str = "fp32"
    groups: str = "split"  # one | split
    fp8_dpa: bool = False
    fp8_mha: bool = False
    compact: bool = True  # FP8 states row-wise only (te_optimizer.compact_fp8_states); False: as FusedAdam makes them
    optimizer: str = "fused_adam"  # fused_adam (TE) | fp8_state (precsearch's FP8StateAdamW: the same numbers, fused)


ROWS: dict[str, Row] = {
    "bf16_std": Row(fp8=False, groups="one"),
    "fp8_std": Row(groups="one"),
    "fp8_m_bf16": Row(exp_avg="bf16", exp_avg_sq="bf16", groups="one"),
    "fp8_m_fp8": Row(exp_avg="fp8", exp_avg_sq="fp8"),
    "fp8_m1_fp8": Row(exp_avg="fp8"),
    "fp8_m2_fp8": Row(exp_avg_sq="fp8"),
    "fp8_m_fp8_one_compact": Row(exp_avg="fp8", exp_avg_sq="fp8", groups="one"),
    "fp8_fp16_master_one": Row(master="fp16", groups="one"),
    "fp8_fp16_master": Row(master="fp16"),
    "fp8_rem": Row(remainders=True, groups="one"),
    "fp8_rem_m_fp8": Row(remainders=True, exp_avg="fp8", exp_avg_sq="fp8"),
    "fp8_rem_m_bf16": Row(remainders=True, exp_avg="bf16", exp_avg_sq="bf16", groups="one"),
    "fp8_rem_m1_fp8_m2_bf16": Row(remainders=True, exp_avg="fp8", exp_avg_sq="bf16"),
    "fp8w_std": Row(fp8_weights=True, groups="one"),
    "fp8w_m_fp8": Row(fp8_weights=True, exp_avg="fp8", exp_avg_sq="fp8"),
    "fp8_dpa": Row(fp8_dpa=True, groups="one"),
    "fp8_mha": Row(fp8_dpa=True, fp8_mha=True, groups="one"),
    "fp8_rem_m_fp8_dpa": Row(remainders=True, exp_avg="fp8", exp_avg_sq="fp8", fp8_dpa=True),
    "bf16_rem_m_fp8": Row(fp8=False, remainders=True, exp_avg="fp8", exp_avg_sq="fp8"),
}
#: The FP8-moment rows again under precsearch's FP8StateAdamW (TE's storage and update, one fused pass a tensor).
ROWS |= {f"{k}_ps": Row(**{**asdict(v), "optimizer": "fp8_state", "groups": "one"}) for k, v in ROWS.items()
         if "fp8" in (v.exp_avg, v.exp_avg_sq) and not v.fp8_weights and v.master == "fp32"
         and not k.endswith("_compact")}
#: precsearch's block-scaled FP8 moments (a scale per 128 elements, the second moment as its root): FP8StateAdamW.
ROWS |= {"fp8_rem_m_fp8b_ps": Row(remainders=True, exp_avg="fp8_block", exp_avg_sq="fp8_block", optimizer="fp8_state",
                                  groups="one"),
         "fp8_m_fp8b_ps": Row(exp_avg="fp8_block", exp_avg_sq="fp8_block", optimizer="fp8_state", groups="one"),
         "bf16_rem_m_fp8b_ps": Row(fp8=False, remainders=True, exp_avg="fp8_block", exp_avg_sq="fp8_block",
                                   optimizer="fp8_state", groups="one")}
#: The first H200 call's rows with FP8 states as FusedAdam makes them (two layouts, created at the first step).
ROWS |= {f"{k}_te": Row(**{**asdict(v), "compact": False}) for k, v in ROWS.items()
         if "fp8" in (v.exp_avg, v.exp_avg_sq) and not k.endswith("_compact") and v.optimizer == "fused_adam"}
#: The first call's one-group rows (FusedAdam's states, one param group: the issue's measurement).
ROWS |= {"fp8_m_fp8_one_te": Row(exp_avg="fp8", exp_avg_sq="fp8", groups="one", compact=False),
         "fp8_rem_m_fp8_one_te": Row(remainders=True, exp_avg="fp8", exp_avg_sq="fp8", groups="one", compact=False)}
BASELINE = "bf16_std"
PHASES = ("forward", "backward", "step")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The shape, steps, rows and output path of one bench call."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("layers", 24), ("dim", 4096), ("ffn", 14336), ("heads", 32), ("kv-heads", 8),
                          ("vocab", 128256), ("seq", 4096), ("mb", 1), ("steps", 5), ("warmup-steps", 2)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/<date>_h200_bench_memory_knobs.json")
    return ap.parse_args(argv)


def te_recipe(row: Row):
    """TE delayed scaling (HYBRID, history 1024, max) with the row's FP8 attention switches."""
    from transformer_engine.common import recipe as r

    return r.DelayedScaling(fp8_format=r.Format.HYBRID, amax_history_len=1024, amax_compute_algo="max",
                            fp8_dpa=row.fp8_dpa, fp8_mha=row.fp8_mha)


def build(cfg, row: Row):
    """The reference model (FP8 weights under ``quantized_model_init``) and its FusedAdam."""
    import transformer_engine.pytorch as te

    if row.fp8_weights:
        with te.quantized_model_init(enabled=True, recipe=te_recipe(row), preserve_high_precision_init_val=True):
            model = Reference(cfg)
    else:
        model = Reference(cfg)
    weights = torch.cuda.memory_allocated()
    if row.optimizer == "fp8_state":
        opt = FP8StateAdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY,
                            master="remainders" if row.remainders else row.master,
                            exp_avg_dtype=row.exp_avg, exp_avg_sq_dtype=row.exp_avg_sq)
        return model, opt, weights
    opt = build_optimizer(model.parameters(), LR, BETAS, WEIGHT_DECAY, master_weights=True,
                          master_weight_dtype=row.master, store_param_remainders=row.remainders,
                          exp_avg_dtype=row.exp_avg, exp_avg_sq_dtype=row.exp_avg_sq,
                          split_groups=row.groups == "split", compact_states=row.compact)
    if row.fp8_weights:
        seed_master_weights(opt)
    return model, opt, weights


def run_row(cfg, args: argparse.Namespace, data, row: Row) -> dict:
    """Train one row's model for ``args.steps`` steps: peak and per-phase memory (from step 1 on, after
    FusedAdam's state exists), optimizer-state bytes, median step time, losses."""
    import transformer_engine.pytorch as te

    free_gpu()
    torch.manual_seed(SEED)
    base = torch.cuda.memory_allocated()
    model, opt, weights = build(cfg, row)
    recipe = te_recipe(row) if row.fp8 else None
    phase_peak = {p: 0 for p in PHASES}
    phase_alloc: dict[str, int] = {}
    ends, losses, state = [], [], 0
    for step in range(args.steps):
        ids, targets = (t.cuda(non_blocking=True) for t in data.train_batch(step))
        steady = step > 0
        marks = {}

        def mark(phase: str) -> None:
            if steady:
                phase_peak[phase] = max(phase_peak[phase], torch.cuda.max_memory_allocated())
                phase_alloc[phase] = torch.cuda.memory_allocated()
            marks[phase] = True

        if steady:
            phase_alloc["start"] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        with te.autocast(enabled=row.fp8, recipe=recipe):
            loss = model(ids, targets)
        mark("forward")
        if steady:
            torch.cuda.reset_peak_memory_stats()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        mark("backward")
        if steady:
            torch.cuda.reset_peak_memory_stats()
        opt.step()
        mark("step")
        opt.zero_grad(set_to_none=True)
        if step == 0:
            state = torch.cuda.memory_allocated() - base - weights
            first_peak = torch.cuda.max_memory_allocated()
        torch.cuda.synchronize()
        ends.append(time.perf_counter())
        losses.append(loss.item())
    gaps = [b - a for a, b in zip(ends, ends[1:])][args.warmup_steps - 1:]
    del model, opt
    peak = max(first_peak, *phase_peak.values())
    return {"config": asdict(row), "tokens_per_s": args.mb * args.seq / statistics.median(gaps),
            "peak_gib": (peak - base) / GIB, "first_step_peak_gib": (first_peak - base) / GIB,
            "weights_gib": weights / GIB, "state_gib": state / GIB,
            "phase_peak_gib": {p: (v - base) / GIB for p, v in phase_peak.items()},
            "phase_alloc_gib": {p: (v - base) / GIB for p, v in phase_alloc.items()},
            "first_loss": losses[0], "last_loss": losses[-1], "losses": losses}


def guarded(cfg, args, data, row: Row) -> dict:
    """:func:`run_row`, with an out-of-memory or any other failure recorded as the row's ``error``."""
    try:
        return run_row(cfg, args, data, row)
    except torch.OutOfMemoryError:
        return {"config": asdict(row), "error": "out of memory"}
    except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
        traceback.print_exc()
        return {"config": asdict(row), "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def table(results: dict[str, dict]) -> str:
    """The rows as a text table, saved memory and speed against the standard-optimizer baseline row."""
    base = results.get(BASELINE, {})
    head = (f"{'row':22s} {'peak GiB':>8} {'saved':>7} {'tok/s':>7} {'x':>5} {'weights':>7} {'state':>6} "
            f"{'fwd pk':>7} {'bwd pk':>7} {'step pk':>7} {'loss':>7}")
    lines = [head]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"{name:22s} error: {r['error']}")
            continue
        saved = 1 - r["peak_gib"] / base["peak_gib"] if "peak_gib" in base else math.nan
        speed = r["tokens_per_s"] / base["tokens_per_s"] if "tokens_per_s" in base else math.nan
        ph = r["phase_peak_gib"]
        lines.append(f"{name:22s} {r['peak_gib']:8.2f} {100 * saved:+6.1f}% {r['tokens_per_s']:7.0f} {speed:5.2f} "
                     f"{r['weights_gib']:7.2f} {r['state_gib']:6.2f} {ph['forward']:7.2f} {ph['backward']:7.2f} "
                     f"{ph['step']:7.2f} {r['last_loss']:7.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the baseline and the chosen rows, print the table, write the JSON (exit 2 without a CUDA GPU)."""
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_memory_knobs needs a CUDA GPU with Transformer Engine", file=sys.stderr)
        return 2
    cfg, data = model_config(args), token_batches(args)
    results: dict[str, dict] = {}
    for name in dict.fromkeys([BASELINE, *args.rows]):
        t0 = time.perf_counter()
        results[name] = guarded(cfg, args, data, ROWS[name])
        r = results[name]
        said = r.get("error") or f"{r['peak_gib']:.2f} GiB, {r['tokens_per_s']:.0f} tok/s"
        print(f"  {name}: {said} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    free_gpu()
    print(f"\n{cfg.n_layers} layers, dim {cfg.dim}, ffn {cfg.ffn_dim}, seq {args.seq}, mb {args.mb}, "
          f"{args.steps} steps; saved and x against {BASELINE} (BF16 params, FP32 master, FP32 moments)")
    print(table(results))
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformer_engine": te_version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "layers": cfg.n_layers, "dim": cfg.dim,
            "ffn": cfg.ffn_dim, "vocab": cfg.vocab_size, "seq": args.seq, "mb": args.mb, "steps": args.steps,
            "warmup_steps": args.warmup_steps, "baseline": BASELINE, "n_params": cfg.num_params()}
    path = args.json or Path("benchmarks/results") / f"{datetime.date.today().isoformat()}_h200_bench_memory_knobs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
