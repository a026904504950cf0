"""Long paired runs behind every optimizer-state knob and GEMM recipe the search offers (issue 54).

A 40-step probe cannot see a failure that comes after a thousand steps: ``fp8_block`` moments beside an FP32
master went NaN after 1,100-1,700 steps on an H100 (the cause and fix: ``fp8_state_adam``'s "Tiny moments").
This bench trains each combination long enough to see it, paired with the standard set-up:

* model: ``bench_stack.Reference`` (``te.TransformerLayer`` blocks, untied BF16 head, written apart from
  precsearch's probe), 4 blocks of width 512, FFN 1536, 8 / 2 heads, byte vocabulary. The ``*_emulated`` rows
  (recipes TE cannot run on Hopper, or at all: MXFP8, NVFP4, FP8 rowwise; and FP8 delayed, to check the
  emulation against TE's row) train precsearch's own Llama3 at the same shape with its block Linears emulated
  (:mod:`precsearch.backends.emulated`), each paired with the same model in BF16 (``bf16_std_emulated``). On a CPU
  (``--smoke``) precsearch's Llama at a toy size, BF16 or emulated compute, to check the bench itself;
* data: the bytes of the Python standard library's source, the last 1% held out; step ``t`` of seed ``s``
  reads the same random windows in every combination;
* training: BF16 parameters, micro-batch 16 x 512, AdamW betas (0.9, 0.95), weight decay 0.1, lr 2e-3 with
  5% linear warm-up, constant, then linear to 0 over the last 25% of the steps (the anneal sharpens the
  truth five-fold against a constant lr), gradients clipped to 1.0; one ``te.autocast`` per step;
* pair: the same seed's run with BF16 compute and the standard optimizer (FP32 master weights and moments);
  gap = held-out loss at the end against its pair's, in %.

Per combination: runs that went non-finite (the step of the first non-finite loss, checked every 50 steps,
and the first tensor found non-finite then: a weight, a gradient or an optimizer state), the mean paired gap
of the finite runs with its standard error, and a verdict at a 0.25% tolerance and at the detection limit
(twice the median standard error over the combinations): ``damaging`` when the gap is beyond 2 SE above the
tolerance, ``benign`` when beyond 2 SE below it, else ``undecided``. A run diverged when its gap is over 20%.

Runs go to a cache (one JSON line each, ``--cache``), so the matrix can be done in parts across calls:
a run already in the cache is not run again. ``--procs`` runs several at once on one GPU (the model is small).

On a GPU the emulated rows of stateless recipes (BF16, MXFP8, NVFP4, FP8 rowwise) run each step's forward and
backward as one CUDA graph replay (:class:`GraphedStep`): emulation launches several small kernels per
quantized operand, and eagerly the step waits on the host for them (H100, 2026-12-07: 2.3x faster for MXFP8,
1.5x for NVFP4). A replay runs the same arithmetic, but cuBLAS may pick other GEMM algorithms under capture:
where a GEMM's sums round (BF16 operands), the replayed losses differ from the eager ones in the last bits and
drift apart as any two trainings do (over 100 steps: BF16 by up to 0.03, MXFP8 not at all, its products of few
bits summing exactly). NVFP4's stochastic rounding draws from the same seeded streams, offset by the capture's
warm-up. ``--graph-check STEPS`` trains each ``--combos`` row eagerly and graphed from one init and prints both
step times and the largest loss difference; ``--no-graph`` turns graphs off.

    python benchmarks/bench_soak.py --combos std_fp32_fp8block std_rem_fp8block --seeds 8 --cache /tmp/soak.jsonl
    python benchmarks/bench_soak.py --smoke --steps 40 --seeds 2 --combos std_fp32_fp8block --cache /tmp/s.jsonl
    python benchmarks/bench_soak.py --report-only --cache runs.jsonl --json out.json
    python benchmarks/bench_soak.py --graph-check 200 --combos mxfp8_emulated nvfp4_emulated --json check.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import itertools
import json
import math
import multiprocessing as mp
import statistics
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

BASE = "bf16_std"
EMULATED_BASE = "bf16_std_emulated"
TOLERANCE = 0.25  # % of the pair's held-out loss
BETAS, WEIGHT_DECAY = (0.9, 0.95), 0.1  # AdamW's, every combination
DIVERGED = 20.0  # % gap: a run this far above its pair diverged
CHECK_EVERY = 50
TIMED_FROM = 10  # a run's step_ms leaves out its first steps (allocation, autotuning)


@dataclass(frozen=True)
class Combo:
    """One combination: GEMM recipe (``bf16``, ``fp8_delayed``, ``fp8_current``, ``fp8_block``) and optimizer state."""

    recipe: str = "bf16"
    master: str = "fp32"  # fp32 | remainders | none (BF16 weights updated in place) | fp16 (TE FusedAdam)
    exp_avg: str = "fp32"  # fp32 | bf16 | fp8 (per-tensor, TE's) | fp8_block
    exp_avg_sq: str = "fp32"
    fp8_weights: bool = False  # TE FusedAdam over te.quantized_model_init weights
    model: str = "te"  # te: bench_stack.Reference | emulated: precsearch's Llama3, block Linears emulated

    @property
    def pair(self) -> str:
        """The BF16 standard row this one is paired with: the same model, BF16 compute, the standard optimizer."""
        return EMULATED_BASE if self.model == "emulated" else BASE

    @property
    def optimizer(self) -> str:
        return "fused_adam" if self.master == "fp16" or self.fp8_weights else "fp8_state"


def _state(master: str, moments: str, recipe: str = "bf16", **kw) -> Combo:
    return Combo(recipe=recipe, master=master, exp_avg=moments, exp_avg_sq=moments, **kw)


#: The matrix: optimizer states under BF16 compute, each recipe family under the standard optimizer, and the
#: combined policies the shipped 8B space's front is made of (FP8 GEMMs + remainders + fp8_block moments).
COMBOS: dict[str, Combo] = {
    BASE: Combo(),
    "std_fp32_bf16": _state("fp32", "bf16"),
    "std_fp32_fp8block": _state("fp32", "fp8_block"),
    "std_fp32_fp8": _state("fp32", "fp8"),
    "std_rem_fp32": _state("remainders", "fp32"),
    "std_rem_bf16": _state("remainders", "bf16"),
    "std_rem_fp8block": _state("remainders", "fp8_block"),
    "std_rem_fp8": _state("remainders", "fp8"),
    "std_none_fp32": _state("none", "fp32"),
    "std_none_fp8block": _state("none", "fp8_block"),
    "std_fp16_fp32": _state("fp16", "fp32"),
    "std_fp32_fp32_fp8w": _state("fp32", "fp32", fp8_weights=True, recipe="fp8_delayed"),
    "fp8_delayed": Combo(recipe="fp8_delayed"),
    "fp8_current": Combo(recipe="fp8_current"),
    "fp8_block": Combo(recipe="fp8_block"),
    "fp8_delayed_rem_fp8block": _state("remainders", "fp8_block", "fp8_delayed"),
    "fp8_block_rem_fp8block": _state("remainders", "fp8_block", "fp8_block"),
    "fp8_current_rem_bf16": _state("remainders", "bf16", "fp8_current"),
    "fp8_current_fp32_fp8block": _state("fp32", "fp8_block", "fp8_current"),
    # the recipes TE runs only from sm_100, or not at all, emulated (precsearch's quantizers) on any GPU, each
    # paired with the same model in BF16; the TE delayed row's emulated twin checks the emulation against TE
    EMULATED_BASE: Combo(model="emulated"),
    "mxfp8_emulated": Combo(recipe="mxfp8", model="emulated"),
    "nvfp4_emulated": Combo(recipe="nvfp4", model="emulated"),
    "fp8_rowwise_emulated": Combo(recipe="fp8_rowwise", model="emulated"),
    "fp8_delayed_emulated": Combo(recipe="fp8_delayed", model="emulated"),
}
BASES = (BASE, EMULATED_BASE)


@dataclass(frozen=True)
class Setup:
    """What every run of one bench call shares (part of each cached run's key)."""

    steps: int = 2000
    layers: int = 4
    dim: int = 512
    ffn: int = 1536
    heads: int = 8
    kv_heads: int = 2
    seq: int = 512
    mb: int = 16
    lr: float = 2e-3
    eval_batches: int = 16
    smoke: bool = False

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def lr_at(step: int, s: Setup) -> float:
    """Warm-up over the first 5% of the steps, constant, then linear to 0 over the last 25%."""
    warm, decay = max(1, s.steps // 20), s.steps - s.steps // 4
    if step < warm:
        return s.lr * (step + 1) / warm
    if step < decay:
        return s.lr
    return s.lr * (s.steps - step) / (s.steps - decay)


_BYTES: dict[str, torch.Tensor] = {}


def stdlib_bytes() -> torch.Tensor:
    """The standard library's ``.py`` sources, sorted by path and concatenated, as uint8 (cached per process)."""
    if "all" not in _BYTES:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
        blob = b"\n".join(p.read_bytes() for p in files)
        _BYTES["all"] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return _BYTES["all"]


def batch(data: torch.Tensor, s: Setup, seed: int, step: int, held_out: bool, device: str):
    """Random windows of ``seq + 1`` bytes: the train part (first 99%) or the held-out part, the same for every
    combination at the same seed and step."""
    split = len(data) * 99 // 100
    lo, hi = (split, len(data)) if held_out else (0, split)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + (10**9 if held_out else 0))
    starts = torch.randint(lo, hi - s.seq - 1, (s.mb,), generator=g)
    rows = torch.stack([data[i:i + s.seq + 1] for i in starts.tolist()]).long().to(device)
    return rows[:, :-1], rows[:, 1:]


def setup(steps: int, smoke: bool = False) -> Setup:
    """The bench's set-up for ``steps`` steps; ``smoke``: the toy CPU size."""
    return Setup(steps=steps, smoke=smoke, **(dict(layers=2, dim=64, ffn=128, heads=4, kv_heads=2, seq=32, mb=4,
                                                   eval_batches=2) if smoke else {}))


def model_config(s: Setup):
    """The model's shape (precsearch's ``ModelConfig``; ``bench_stack.Reference`` takes it too)."""
    from precsearch.probe.model.llama3 import PRESETS

    return PRESETS["llama3-8b"].with_overrides(n_layers=s.layers, dim=s.dim, ffn_dim=s.ffn, n_heads=s.heads,
                                               n_kv_heads=s.kv_heads, vocab_size=256, max_seq_len=max(s.seq, 1024))


def build(combo: Combo, s: Setup, seed: int):
    """The model (seeded init, identical across combinations of one seed) and its optimizer."""
    from precsearch.backends.fp8_state_adam import FP8StateAdamW

    cfg = model_config(s)
    torch.manual_seed(seed)
    if s.smoke or combo.model == "emulated":
        model = emulated_model(combo, cfg, seed, "cpu" if s.smoke else "cuda")
    elif combo.fp8_weights:
        import transformer_engine.pytorch as te
        from bench_stack import Reference

        with te.quantized_model_init(enabled=True, recipe=te_recipe(combo.recipe),
                                     preserve_high_precision_init_val=True):
            model = Reference(cfg)
    else:
        from bench_stack import Reference

        model = Reference(cfg)
    hyper = dict(lr=s.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    if combo.optimizer == "fp8_state":
        return model, FP8StateAdamW(model.parameters(), master=combo.master, exp_avg_dtype=combo.exp_avg,
                                    exp_avg_sq_dtype=combo.exp_avg_sq, **hyper)
    from precsearch.backends.te_optimizer import build_optimizer, seed_master_weights

    opt = build_optimizer(model.parameters(), hyper["lr"], hyper["betas"], hyper["weight_decay"],
                          master_weights=True, master_weight_dtype=combo.master if combo.master != "remainders"
                          else "fp32", store_param_remainders=combo.master == "remainders",
                          exp_avg_dtype=combo.exp_avg, exp_avg_sq_dtype=combo.exp_avg_sq)
    if combo.fp8_weights:
        seed_master_weights(opt)
    return model, opt


def emulated_model(combo: Combo, cfg, seed: int, device: str):
    """precsearch's Llama3 in BF16 (its own seeded init), every block Linear emulating ``combo.recipe`` with
    precsearch's default settings of it (:class:`~precsearch.precision.LayerRecipe`); the output layer BF16."""
    from precsearch.backends.emulated import EmulatedBackend
    from precsearch.precision import LayerRecipe, Precision
    from precsearch.probe.model.llama3 import build_model

    model = build_model(cfg, seed, device).to(torch.bfloat16)
    if combo.recipe != "bf16":
        recipe = LayerRecipe(precision=Precision(combo.recipe))
        blocks = [name for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and name.startswith("decoder.")]
        backend = EmulatedBackend()
        backend.convert(model, {name: recipe for name in blocks})
        backend.track_stats(model, False)  # no FP8 statistics: none is read, and they cost a third of a pass
    return model


def te_recipe(recipe: str):
    """Transformer Engine's recipe object for a GEMM recipe name (precsearch's defaults: HYBRID, history 1024)."""
    from transformer_engine.common import recipe as r

    if recipe == "fp8_delayed":
        return r.DelayedScaling(fp8_format=r.Format.HYBRID, amax_history_len=1024, amax_compute_algo="max")
    if recipe == "fp8_current":
        return r.Float8CurrentScaling(fp8_format=r.Format.HYBRID)
    if recipe == "fp8_block":
        return r.Float8BlockScaling(fp8_format=r.Format.E4M3)
    raise ValueError(f"no TE recipe {recipe!r}")


def forward(model, ids, targets, combo: Combo, s: Setup):
    """The mean next-byte cross-entropy, under the combination's autocast."""
    if s.smoke or combo.model == "emulated":  # the emulated layers quantize in their own forward
        return F.cross_entropy(model(ids).float().flatten(0, 1), targets.flatten())
    import transformer_engine.pytorch as te

    fp8 = combo.recipe != "bf16"
    with te.autocast(enabled=fp8, recipe=te_recipe(combo.recipe) if fp8 else None):
        return model(ids, targets)


#: The emulated recipes whose scalers keep no state across passes, so a captured step replays their training.
#: (Delayed scaling's amax history would be advanced by the capture's warm-up passes.)
GRAPHED_RECIPES = frozenset({"bf16", "mxfp8", "nvfp4", "fp8_rowwise"})
GRAPH_WARMUP = 3  # eager passes on a side stream before the capture, as torch.cuda.graph asks


def graphable(combo: Combo, device: str) -> bool:
    """Whether ``combo``'s forward and backward run as one CUDA graph on ``device`` (:class:`GraphedStep`)."""
    return device == "cuda" and combo.model == "emulated" and combo.recipe in GRAPHED_RECIPES


def _generators(model) -> list[torch.Generator]:
    """The emulated scalers' own random streams (NVFP4 stochastic rounding), made by the warm-up passes."""
    return [g for m in model.modules() for role in ("input_scaler", "weight_scaler", "grad_output_scaler")
            if (g := getattr(getattr(m, role, None), "_generator", None)) is not None]


class GraphedStep:
    """One step's forward and backward captured as a CUDA graph, replayed on each new batch.

    The batch is copied into the graph's own input tensors; each replay writes every parameter's ``.grad`` into
    the tensor the capture made, so the optimizer reads them as usual and the grads must not be set to None
    between steps (zero-filling is not needed either: the replay assigns them, as a backward from no grad does).
    The warm-up passes touch no weight: they only make the lazily built state (scalers' random streams, the
    Hadamard matrix, cuBLAS handles) before the capture.
    """

    def __init__(self, model, combo: Combo, s: Setup, ids: torch.Tensor, targets: torch.Tensor):
        self.ids, self.targets = ids.clone(), targets.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                forward(model, self.ids, self.targets, combo, s).backward()
        torch.cuda.current_stream().wait_stream(side)
        model.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        for g in _generators(model):
            self.graph.register_generator_state(g)
        with torch.cuda.graph(self.graph):
            self.loss = forward(model, self.ids, self.targets, combo, s)
            self.loss.backward()

    def __call__(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The step's loss (the graph's own tensor: copy it before the next replay); the grads are filled."""
        self.ids.copy_(ids)
        self.targets.copy_(targets)
        self.graph.replay()
        return self.loss


def first_non_finite(model, opt) -> str | None:
    """The name of the first gradient, optimizer state or weight that holds a NaN or inf, else None (the probe's
    own check, :mod:`precsearch.probe.measure.nonfinite`: a parameter's states before its weight)."""
    from precsearch.probe.measure.nonfinite import first_nonfinite, named_grads, named_update_tensors

    return first_nonfinite(itertools.chain(named_grads(model), named_update_tensors(model, opt)))


def train(combo_name: str, seed: int, s: Setup, on_state=None, graph: bool = True,
          keep_losses: bool = False) -> dict:
    """One run: the held-out loss at the end, or where it went non-finite. ``on_state(step, model, opt)``, when
    given, is called before each step's forward (the state after ``step`` steps; ``bench_judge_soak`` keeps some).
    ``graph``: replay each step as a CUDA graph where :func:`graphable` allows (the record says which ran).
    The record's ``step_ms`` is the mean step time after the first ``TIMED_FROM`` steps, its ``loss_curve`` the
    mean training loss of each ``CHECK_EVERY`` steps; ``keep_losses`` adds every step's training loss."""
    combo, device = COMBOS[combo_name], "cpu" if s.smoke else "cuda"
    data = stdlib_bytes()
    model, opt = build(combo, s, seed)
    losses = torch.zeros(s.steps, device=device)
    began, record = time.time(), {"combo": combo_name, "seed": seed, "setup": s.key()}
    if combo.model == "emulated" and combo.recipe != "bf16":  # which GEMMs the emulated layers ran
        from precsearch.backends import emulated

        record["emulated_gemms"] = emulated.CODE_GEMMS
    graphed = None
    if graph and graphable(combo, device):
        graphed = GraphedStep(model, combo, s, *batch(data, s, seed, 0, False, device))
    record["cuda_graph"] = graphed is not None
    timed_from = min(TIMED_FROM, s.steps - 1)
    for step in range(s.steps):
        if step == timed_from:
            _sync(device)
            timer = time.perf_counter()
        if on_state is not None:
            on_state(step, model, opt)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        if graphed is not None:
            loss = graphed(*batch(data, s, seed, step, False, device))
        else:
            loss = forward(model, *batch(data, s, seed, step, False, device), combo, s)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        bad_before_step = first_non_finite(model, opt) if (step + 1) % CHECK_EVERY == 0 else None
        opt.step()
        if graphed is None:  # a replay assigns the grads the capture made: keep them
            opt.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
        if (step + 1) % CHECK_EVERY == 0 or step == s.steps - 1:
            finite = torch.isfinite(losses[:step + 1])
            tensor = bad_before_step or first_non_finite(model, opt)
            if not finite.all() or tensor:
                first = int((~finite).nonzero()[0]) if not finite.all() else step
                record |= {"non_finite_step": first, "non_finite_tensor": tensor or "loss", "steps_run": step + 1}
                break
    else:
        _sync(device)
        record["step_ms"] = round(1000 * (time.perf_counter() - timer) / (s.steps - timed_from), 2)
        with torch.no_grad():
            held = [float(forward(model, *batch(data, s, seed, k, True, device), combo, s))
                    for k in range(s.eval_batches)]
        record |= {"held_out_loss": statistics.fmean(held), "steps_run": s.steps,
                   "final_train_loss": float(losses[-1])}
    ran = losses[:record["steps_run"]]
    # the mean training loss of each CHECK_EVERY-step window: where a run parts from its pair, at 40 numbers a run
    record["loss_curve"] = [round(float(w.mean()), 4) for w in ran.split(CHECK_EVERY)]
    if keep_losses:
        record["losses"] = ran.tolist()
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"  # a cache may mix cards
    return record | {"seconds": round(time.time() - began, 1), "card": card}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def graph_check(combos: list[str], s: Setup, seed: int = 0) -> list[dict]:
    """Each combination trained ``s.steps`` steps eagerly and then as CUDA graph replays, from one init: both step
    times and the largest difference between the two runs' training losses (0 when the replay is exact)."""
    rows = []
    for name in combos:
        eager, replayed = (train(name, seed, s, graph=g, keep_losses=True) for g in (False, True))
        diff = max((abs(a - b) for a, b in zip(eager["losses"], replayed["losses"])), default=math.nan)
        rows.append({"combo": name, "graphed": replayed["cuda_graph"], "eager_step_ms": eager.get("step_ms"),
                     "graphed_step_ms": replayed.get("step_ms"), "max_loss_diff": diff,
                     "final_loss": (eager["losses"][-1], replayed["losses"][-1])})
        print(f"{name}: eager {eager.get('step_ms')} ms/step, graphed {replayed.get('step_ms')} ms/step "
              f"(graph {'on' if replayed['cuda_graph'] else 'not possible'}), largest loss difference {diff:.3g}",
              flush=True)
    return rows


def _worker_init() -> None:
    torch.set_num_threads(1)


def run_jobs(jobs: list[tuple[str, int]], s: Setup, procs: int, budget_s: float, cache: Path,
             graph: bool = True) -> None:
    """Run ``jobs`` over ``procs`` processes, appending each record to ``cache``; once the time left is under
    the slowest run so far, the jobs not started are cancelled (the cache keeps what finished)."""
    began, slowest = time.time(), 0.0
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(procs, mp_context=ctx, initializer=_worker_init) as pool:
        futures = {pool.submit(train, c, seed, s, None, graph): (c, seed) for c, seed in jobs}
        for done in cf.as_completed(futures):
            if done.cancelled():
                continue
            c, seed = futures[done]
            try:
                record = done.result()
            except Exception as e:  # a crashed run is a result too: it names the combination
                record = {"combo": c, "seed": seed, "setup": s.key(), "error": f"{type(e).__name__}: {e}"}
            with cache.open("a") as f:
                f.write(json.dumps(record) + "\n")
            slowest = max(slowest, record.get("seconds", 0.0))
            print(f"[{time.time() - began:6.0f}s] {c} seed {seed}: " + _describe(record), flush=True)
            if budget_s and time.time() - began + slowest > budget_s:
                cancelled = sum(f.cancel() for f in futures if not f.done())
                if cancelled:
                    print(f"budget: {cancelled} runs not started (run the same command again to do them)", flush=True)


def _describe(r: dict) -> str:
    if "error" in r:
        return f"error {r['error']}"
    if "non_finite_step" in r:
        return f"NON-FINITE at step {r['non_finite_step']} in {r['non_finite_tensor']} ({r['seconds']} s)"
    return f"held-out loss {r['held_out_loss']:.4f} ({r['seconds']} s)"


def load_cache(cache: Path, s: Setup) -> dict[tuple[str, int], dict]:
    """The cached runs of this setup, by (combination, seed); a later line replaces an earlier one."""
    runs: dict[tuple[str, int], dict] = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            if r.get("setup") == s.key() and "error" not in r:
                runs[(r["combo"], r["seed"])] = r
    return runs


def verdict(mean: float, se: float, tol: float) -> str:
    """``damaging`` beyond 2 SE above ``tol``, ``benign`` beyond 2 SE below it, else ``undecided``."""
    if math.isnan(mean) or math.isnan(se):
        return "undecided"
    if mean - 2 * se > tol:
        return "damaging"
    if mean + 2 * se < tol:
        return "benign"
    return "undecided"


def diverged_seeds(row: dict) -> dict:
    """The seeds of a :func:`summarise` row whose finite paired gap is over :data:`DIVERGED`, with their gaps."""
    return {seed: g for seed, g in row["gaps_pct"].items() if math.isfinite(g) and g > DIVERGED}


def summarise(runs: dict[tuple[str, int], dict]) -> dict:
    """Per combination: runs, non-finite runs (step, tensor), diverged runs, paired gap mean and SE, verdicts."""
    rows = {}
    for name in COMBOS:
        mine = {seed: r for (c, seed), r in runs.items() if c == name}
        if not mine:
            continue
        bad = [{"seed": seed, "step": r["non_finite_step"], "tensor": r["non_finite_tensor"]}
               for seed, r in sorted(mine.items()) if "non_finite_step" in r]
        pair = COMBOS[name].pair
        paired_seeds = [seed for seed, r in sorted(mine.items())
                        if "held_out_loss" in r and "held_out_loss" in runs.get((pair, seed), {})]
        gaps = [100 * (mine[seed]["held_out_loss"] / runs[(pair, seed)]["held_out_loss"] - 1) for seed in paired_seeds]
        finite_gaps = [g for g in gaps if math.isfinite(g)]
        mean = statistics.fmean(finite_gaps) if finite_gaps else math.nan
        se = statistics.stdev(finite_gaps) / math.sqrt(len(finite_gaps)) if len(finite_gaps) > 1 else math.nan
        rows[name] = {"combo": asdict(COMBOS[name]), "runs": len(mine), "paired": len(finite_gaps),
                      "non_finite": bad, "gaps_pct": dict(zip(paired_seeds, gaps)),
                      "gap_pct": mean, "se_pct": se, "at_tolerance": verdict(mean, se, TOLERANCE)}
        rows[name]["diverged"] = len(diverged_seeds(rows[name]))
    ses = [r["se_pct"] for n, r in rows.items() if n not in BASES and r["paired"] >= 4 and not r["diverged"]
           and math.isfinite(r["se_pct"])]
    limit = 2 * statistics.median(ses) if ses else math.nan
    for name, r in rows.items():
        r["at_detection_limit"] = verdict(r["gap_pct"], r["se_pct"], limit)
        r["status"] = ("non-finite" if r["non_finite"] else "diverged" if r["diverged"]
                       else "damaging" if r["at_tolerance"] == "damaging" else "ok")
    return {"tolerance_pct": TOLERANCE, "detection_limit_pct": limit, "rows": rows}


def table(report: dict) -> str:
    lines = [f"tolerance {report['tolerance_pct']}%, detection limit {report['detection_limit_pct']:.2f}% "
             "(2 x the median SE)",
             "| combination | recipe | master | moments (m, v) | runs | non-finite (seed: step, tensor) | "
             f"diverged (seed: gap > {DIVERGED:g}%) | paired gap % ± SE | at 0.25% | at the limit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["rows"].items():
        c = r["combo"]
        bad = "; ".join(f"{b['seed']}: {b['step']}, {b['tensor']}" for b in r["non_finite"]) or "0"
        far = "; ".join(f"{seed}: {g:+.1f}%" for seed, g in diverged_seeds(r).items()) or "0"
        base = name in BASES
        gap = "—" if base else f"{r['gap_pct']:+.2f} ± {r['se_pct']:.2f}"
        moments = f"{c['exp_avg']}, {c['exp_avg_sq']}" + (", FP8 weights" if c["fp8_weights"] else "")
        recipe = c["recipe"] + (" (emulated)" if c.get("model") == "emulated" else "")
        lines.append(f"| {name} | {recipe} | {c['master']} | {moments} | {r['runs']} | {bad} | {far} | {gap} | "
                     f"{'' if base else r['at_tolerance']} | {'' if base else r['at_detection_limit']} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--combos", nargs="+", choices=list(COMBOS), default=list(COMBOS))
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=Setup.steps)
    ap.add_argument("--procs", type=int, default=1, help="runs at once (one GPU holds several of this size)")
    ap.add_argument("--budget-s", type=float, default=0.0, help="stop starting runs when this is about spent")
    ap.add_argument("--smoke", action="store_true", help="CPU, a toy model, BF16 compute: checks the bench only")
    ap.add_argument("--report-only", action="store_true", help="summarise the cache, run nothing")
    ap.add_argument("--no-graph", action="store_true", help="run every step eagerly (no CUDA graph)")
    ap.add_argument("--graph-check", type=int, metavar="STEPS",
                    help="train each --combos row STEPS steps eagerly and graphed, compare; writes --json")
    ap.add_argument("--cache", type=Path, help="the run cache (JSON lines); every mode but --graph-check")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.seeds < 2 or args.steps < CHECK_EVERY or args.procs < 1:
        ap.error("need --seeds >= 2, --steps >= 50, --procs >= 1")
    if args.graph_check is not None and args.graph_check <= TIMED_FROM:
        ap.error(f"--graph-check needs more than {TIMED_FROM} steps (the first {TIMED_FROM} are not timed), "
                 f"got {args.graph_check}")
    if args.cache is None and args.graph_check is None:
        ap.error("--cache is required (the run cache, one JSON line per run)")
    te_only = [c for c in args.combos if COMBOS[c].optimizer != "fp8_state"
               or (COMBOS[c].recipe != "bf16" and COMBOS[c].model != "emulated")]
    if args.smoke and te_only:
        ap.error("--smoke runs FP8StateAdamW with BF16 or emulated compute only: " + ", ".join(te_only))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.graph_check:
        rows = graph_check(args.combos, setup(args.graph_check, args.smoke))
        if args.json:
            args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "graph_check": rows},
                                            indent=1))
        return 0
    s = setup(args.steps, args.smoke)
    done = load_cache(args.cache, s)
    pairs = list(dict.fromkeys(COMBOS[c].pair for c in args.combos))  # only the bases the rows are paired with
    wanted = pairs + [c for c in args.combos if c not in pairs]
    jobs = [(c, seed) for seed in range(args.seeds) for c in wanted if (c, seed) not in done]
    if jobs and not args.report_only:
        print(f"{len(jobs)} runs to do ({len(done)} cached), {args.procs} at a time", flush=True)
        run_jobs(jobs, s, args.procs, args.budget_s, args.cache, graph=not args.no_graph)
    report = summarise(load_cache(args.cache, s))
    report |= {"date": datetime.date.today().isoformat(), "setup": asdict(s),
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "not_run": [c for c in COMBOS if c not in report["rows"]]}
    print(table(report))
    print("not run: " + (", ".join(report["not_run"]) or "none"))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
