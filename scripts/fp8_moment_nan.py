"""Where TE FusedAdam's FP8 moments with a whole FP32 master first go non-finite (issue 31's unexplained NaN).

Trains ``bench_memory_knobs.py``'s rows (its plain TE Llama, its optimizer set-up) for a few steps and, after
every optimizer step, lists the parameters whose weights or dequantized moments are no longer finite, with
what their gradient looked like before the step (all zero? largest magnitude) and the moment's amax. GPU only.

    python scripts/fp8_moment_nan.py --layers 24 --rows fp8_m_fp8 fp8_rem_m_fp8 fp8_m_fp8_ps --json /tmp/nan.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory_knobs import ROWS, build, te_recipe  # noqa: E402
from bench_stack import CLIP, SEED, free_gpu, model_config, token_batches  # noqa: E402


def _moment(opt, p, name: str) -> torch.Tensor | None:
    state = opt.state.get(p, {})
    x = state.get(name)
    if x is None:
        return None
    x = x.float()
    scale_inv = state.get(f"{name}_scale_inv")
    return x * scale_inv if scale_inv is not None else x


def trace_row(cfg, args: argparse.Namespace, data, name: str) -> dict:
    """Per step: the loss, how many gradients were all zero, and each parameter that went non-finite."""
    import transformer_engine.pytorch as te

    free_gpu()
    torch.manual_seed(SEED)
    row = ROWS[name]
    model, opt, _ = build(cfg, row)
    names = {p: n for n, p in model.named_parameters()}
    steps = []
    for step in range(args.steps):
        ids, targets = (t.cuda(non_blocking=True) for t in data.train_batch(step))
        with te.autocast(enabled=row.fp8, recipe=te_recipe(row) if row.fp8 else None):
            loss = model(ids, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        grads = {p: (bool((p.grad == 0).all()), float(p.grad.abs().max())) for p in model.parameters()
                 if p.grad is not None}
        opt.step()
        bad = []
        for p, (zero, gmax) in grads.items():
            moments = {m: _moment(opt, p, m) for m in ("exp_avg", "exp_avg_sq")}
            finite = {"weight": bool(torch.isfinite(p.detach().float()).all())}
            finite |= {m: bool(torch.isfinite(x).all()) for m, x in moments.items() if x is not None}
            if not all(finite.values()):
                amax = {m: float(x[torch.isfinite(x)].abs().max()) if torch.isfinite(x).any() else None
                        for m, x in moments.items() if x is not None}
                bad.append({"param": names[p], "shape": list(p.shape), "dtype": str(p.dtype), "finite": finite,
                            "grad_all_zero": zero, "grad_amax": gmax, "finite_moment_amax": amax})
        steps.append({"step": step, "loss": float(loss), "grad_norm": float(norm),
                      "all_zero_grads": [names[p] for p, (z, _) in grads.items() if z],
                      "non_finite": bad})
        opt.zero_grad(set_to_none=True)
        print(f"{name} step {step}: loss {float(loss):.4f}, grad norm {float(norm):.3g}, "
              f"{len(steps[-1]['all_zero_grads'])} all-zero grads, {len(bad)} non-finite params"
              + (f" (first: {bad[0]})" if bad else ""), flush=True)
    del model, opt
    return {"row": name, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("layers", 24), ("dim", 4096), ("ffn", 14336), ("heads", 32), ("kv-heads", 8),
                          ("vocab", 128256), ("seq", 4096), ("mb", 1), ("steps", 5)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=["fp8_m_fp8", "fp8_rem_m_fp8", "fp8_m_fp8_ps"])
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    cfg, data = model_config(args), token_batches(args)
    out = [trace_row(cfg, args, data, name) for name in args.rows]
    args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
