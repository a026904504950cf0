"""Probe fidelity: do the short verdict, the promoted verdict and the risk score predict the long run?

For each policy (FP8 recipes on every block, on the MLP or attention only, FP8
logits, and deliberately fragile ones: E4M3 gradients, one-step amax
histories, 2x and 4x learning rates without LR warm-up or clipping; plus, as a
control, BF16 from another init seed), trains the same model on the same data
as ONE run cut into rungs (``--rungs``, e.g. 50 200 2000: the probe, the
promoted probe, the long run), each rung continuing the previous one from its
checkpoint (:mod:`precsearch.probe.continuation`, as a study's fidelity rungs
do), against a BF16 reference cut the same way, for ``--seeds`` init seeds.
Each rung is read two ways (``final``: held-out loss gap; ``tail``: paired
training-loss gap over the last quarter, negative counting as 0), and the first
rung also gets the early-warning risk score (:mod:`precsearch.probe.measure.risk`, with
the BF16 seeds' spread). The truth is the long rung's final gap, averaged over
seeds. Reports Kendall's tau-b against it and stable/unstable agreement for:
the short verdict, the promoted verdict, and the risk score (risky = unstable),
and whether each fragile policy was flagged before the long run. Prints a
table and writes JSON.

The data is real text, pre-tokenized: the Python standard library's source as
bytes, written once to a ``.npy`` token file and read back through
``data.source: tokens``, as a user's corpus would be.

    python benchmarks/bench_fidelity.py --rungs 50 200 2000 --seeds 2 --out $OUT   # H200 (size the model to fit)
    python benchmarks/bench_fidelity.py --smoke --out /tmp/bf                       # CPU, tiny model, ~1 min
    bash gpu_judge.sh@50dddce                                                     # the judge on the H200
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import re
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fidelity_judge beside this file, however it is loaded
import fidelity_judge  # noqa: E402
import planted_damage  # noqa: E402

from precsearch.backends import get_backend
from precsearch.config.damage_section import DEFAULT_LIMITS
from precsearch.config.loader import load_space
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import AmaxAlgo, Fp8Format, LayerRecipe, Precision
from precsearch.probe.continuation import Leg
from precsearch.probe.damage import MEASURES, DamageReader
from precsearch.probe.data import TokenBatches, load_tokens
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.result import ProbeResult
from precsearch.probe.measure.risk import THRESHOLD, risk_score, seed_spread
from precsearch.probe.runner import run_probe
from precsearch.probe.measure.signals import Signals
from precsearch.runtime.evaluate import front_policies, te_version
from precsearch.search.sampling import policy_from_params
from precsearch.search.scoring import tail_gap

BLOCKS = "decoder.layers.*"
ATTENTION, MLP, OUTPUT = ("*.self_attention.*",), ("*.mlp.*",), "output_layer"
TAIL_FRACTION = 0.25


@dataclass(frozen=True)
class Case:
    """A policy and the probe settings it is stressed with (its BF16 reference shares them)."""

    policy: Policy
    lr_multiplier: float = 1.0
    lr_warmup: bool = True
    seed: int = 0  # added to the run's seed (the BF16 control trains from another init than its reference)
    fragile: bool = False
    warmup_share: float = 0.0  # BF16 warm-up as a share of the first rung
    param_dtype: str | None = None  # the probe's parameter dtype, if not the bench's (study trials: their space's)
    backend: str | None = None  # a backend of its own, reference included (NVFP4: emulated where TE cannot run it)
    baseline_memory: MemoryKnobs | None = None  # the BF16 reference's memory knobs (default: plain AdamW)

    def policy_for(self, rungs: list[int]) -> Policy:
        return replace(self.policy, warmup_steps=int(self.warmup_share * rungs[0]))

    def probe(self, base: ProbeSection, steps: int, horizon: int, seed: int) -> ProbeSection:
        warmup = max(1, horizon // 20) if self.lr_warmup else 0
        return base.model_copy(update={"steps": steps, "lr": base.lr * self.lr_multiplier,
                                       "lr_warmup_steps": warmup, "seed": seed + self.seed,
                                       "param_dtype": self.param_dtype or base.param_dtype})

    def reference_key(self) -> tuple:
        own = (self.backend,) if self.backend else ()  # a case with its own backend has its own reference
        return (self.lr_multiplier, self.lr_warmup, self.policy.clip_grad, self.param_dtype, self.baseline_memory) + own

    def reference_policy(self) -> Policy:
        return Policy.bf16(self.policy.clip_grad, self.baseline_memory)


def cases(clip: float | None) -> dict[str, Case]:
    """The policies compared, robust ones first, then fragile ones (``fragile=True``)."""
    def fp8(p: Precision, modules: tuple[str, ...] = (BLOCKS,), **kw) -> Policy:
        return Policy(rules=(Rule("fp8", modules, p),), **({"clip_grad": clip} | kw))

    e4m3_h1 = LayerRecipe(fp8_format=Fp8Format.E4M3, amax_history_len=1, amax_compute_algo=AmaxAlgo.MOST_RECENT)
    hybrid_h1 = LayerRecipe(amax_history_len=1, amax_compute_algo=AmaxAlgo.MOST_RECENT)
    edges = Rule("edges", ("*",), Precision.BF16, first=1, last=1)
    return {
        "BF16, init seed +1 (control)": Case(Policy(clip_grad=clip), seed=1),
        "fp8_delayed, blocks": Case(fp8(Precision.FP8_DELAYED)),
        "fp8_current, blocks": Case(fp8(Precision.FP8_CURRENT)),
        "fp8_block, blocks": Case(fp8(Precision.FP8_BLOCK)),
        "fp8_current, MLP only": Case(fp8(Precision.FP8_CURRENT, MLP)),
        "fp8_current, attention only": Case(fp8(Precision.FP8_CURRENT, ATTENTION)),
        "fp8_delayed, first/last block BF16": Case(Policy(rules=(edges, Rule("fp8", (BLOCKS,), Precision.FP8_DELAYED)),
                                                          clip_grad=clip)),
        # TE's NVFP4 recipe (Hadamard, 16x16 weights, stochastic rounding) emulated: the H200 cannot run it
        "nvfp4, blocks, last block BF16 (emulated)": Case(Policy(rules=(Rule("last", ("*",), Precision.BF16, last=1),
                                                                        Rule("fp4", (BLOCKS,), Precision.NVFP4)),
                                                                 clip_grad=clip), backend="emulated"),
        "fp8_delayed, BF16 warm-up 20% of the probe": Case(fp8(Precision.FP8_DELAYED), warmup_share=0.2),
        "fp8_delayed, every unit incl. output_layer": Case(Policy(default=Precision.FP8_DELAYED, clip_grad=clip)),
        "fp8_block, every unit incl. output_layer": Case(Policy(default=Precision.FP8_BLOCK, clip_grad=clip)),
        "fp8_delayed, no clipping": Case(fp8(Precision.FP8_DELAYED, clip_grad=None)),
        **memory_cases(fp8(Precision.FP8_DELAYED)),
        "fp8_delayed E4M3 grads, amax history 1": Case(Policy(default=Precision.FP8_DELAYED, recipe=e4m3_h1,
                                                              clip_grad=clip), fragile=True),
        "fp8_delayed, amax history 1": Case(fp8(Precision.FP8_DELAYED, recipe=hybrid_h1), fragile=True),
        "fp8_current E4M3 grads": Case(fp8(Precision.FP8_CURRENT, recipe=LayerRecipe(fp8_format=Fp8Format.E4M3)),
                                       fragile=True),
        "fp8_current, 2x lr": Case(fp8(Precision.FP8_CURRENT), lr_multiplier=2.0, fragile=True),
        "fp8_delayed, 4x lr, no LR warm-up": Case(fp8(Precision.FP8_DELAYED), lr_multiplier=4.0, lr_warmup=False,
                                                  fragile=True),
        "fp8_current incl. output_layer, 4x lr, no clip": Case(Policy(default=Precision.FP8_CURRENT),
                                                               lr_multiplier=4.0, fragile=True),
    }


#: The name prefix of the judge's graded series (planted_damage): with the decided policies, the issue's target set.
PLANTED = "planted:"

#: The standard mixed-precision optimizer (BF16 parameters, FP32 master weights and moments): the reference of
#: the optimizer-knob cases, which change training dynamics (issue 22) and are read against it.
STANDARD = MemoryKnobs(master_weights=True, moment_dtype="fp32")


def memory_cases(policy: Policy) -> dict[str, Case]:
    """FP8 delayed blocks with the optimizer-state knobs, BF16 parameters, against the standard optimizer."""
    knobs = {
        "FP8 moments + param remainders": dict(moment_dtype="fp8", master_dtype="remainders"),
        "FP8 exp_avg, BF16 exp_avg_sq + param remainders": dict(moment_dtype="bf16", exp_avg_dtype="fp8",
                                                                master_dtype="remainders"),
        "FP16 master weights": dict(moment_dtype="fp32", master_dtype="fp16"),
        "BF16 moments": dict(moment_dtype="bf16"),
    }
    out = {f"fp8_delayed, {name}": Case(replace(policy, memory=MemoryKnobs(master_weights=True, **kw)),
                                        param_dtype="bf16", baseline_memory=STANDARD) for name, kw in knobs.items()}
    # NaN within 5 steps at the 8B width on the H200 (2026-11-30_h200_memory_model_vs_measured.md@f92cb8e)
    out["fp8_delayed, FP8 moments, full FP32 master"] = Case(
        replace(policy, memory=MemoryKnobs(master_weights=True, moment_dtype="fp8")), param_dtype="bf16",
        baseline_memory=STANDARD, fragile=True)
    return out


def judge_cases(clip: float | None) -> dict[str, Case]:
    """The judge's policies (issue 28): benign FP8 recipes, then damage planted at graded severity.

    Every one differs from its BF16 reference in precision only (same lr, warm-up and clipping): a reading
    taken at fixed states cannot see a learning rate, so lr-stressed cases are left to :func:`cases`.
    """
    def fp8(p: Precision, modules: tuple[str, ...] = (BLOCKS,), **kw) -> Policy:
        return Policy(rules=(Rule("fp8", modules, p),), **({"clip_grad": clip} | kw))

    def nvfp4(**knobs) -> Case:  # TE's NVFP4 recipe with some of its safeguards off, emulated
        recipe = LayerRecipe(precision=Precision.NVFP4, **knobs)
        return Case(Policy(rules=(Rule("fp4", (BLOCKS,), Precision.NVFP4),), recipe=recipe, clip_grad=clip),
                    backend="emulated")

    every = cases(clip)
    # Eleven policies, 88 long runs with their references: what one H200 session's device time holds at the
    # judge's shape (about 5 GPU-seconds a 1000-step run). cases() has the rest, for a later judge.
    benign = ["fp8_delayed, blocks", "fp8_current, blocks", "fp8_block, blocks"]
    planted = ["fp8_delayed, every unit incl. output_layer", "fp8_delayed, amax history 1",
               "fp8_delayed E4M3 grads, amax history 1"]
    out = {name: every[name] for name in benign + planted}
    memory = memory_cases(fp8(Precision.FP8_DELAYED))
    out |= {name: memory[name] for name in ("fp8_delayed, FP8 moments + param remainders",
                                            "fp8_delayed, FP16 master weights")}
    # BF16 parameters updated in place by AdamW, no master copy: updates below BF16's quantum are lost
    out["fp8_delayed, BF16 weights without a master copy"] = Case(fp8(Precision.FP8_DELAYED), param_dtype="bf16",
                                                                  baseline_memory=STANDARD)
    # damage of a known, graded severity: the blocks' GEMM operands at fewer mantissa bits (planted_damage)
    for bits in (0, 1, 2, 3):
        out[f"{PLANTED} blocks' GEMMs at {bits} mantissa bits"] = Case(fp8(Precision.FP8_CURRENT),
                                                                     backend=f"{planted_damage.PREFIX}{bits}")
    # last: emulated NVFP4 runs take minutes each, so a call with a deadline does the others first
    out |= {"nvfp4, blocks (emulated)": nvfp4(),
            "nvfp4 without SR, RHT and 2D weights (emulated)": nvfp4(nvfp4_stochastic_rounding=False,
                                                                     nvfp4_rht=False, nvfp4_2d_weights=False)}
    return out


# The three best stable trials by memory saved of the 16-trial study of search_spaces/llama3_8b_h100.yaml
# on the H200 (2026-11-30, 2026-11-30_h200_llama3_8b_h100_study_trials.txt@2d4ed84): trial 15 is
# its Pareto front; 1 and 11 the next stable ones. Params as the study stored them, except that the space no
# longer searches amax_compute_algo (fixed max): most_recent is written as its equal, a history of 1.
STUDY_TRIALS = {
    15: {"precision.edge_blocks": "bf16", "precision.attention": "bf16", "precision.mlp": "fp8_current",
         "recipe.amax_history_len": 1, "recipe.amax_compute_algo": "max", "warmup_steps": 0,
         "clip_grad": 1.0, "memory.moment_dtype": "bf16", "memory.fp8_weights": False},
    1: {"precision.edge_blocks": "bf16", "precision.attention": "fp8_delayed", "precision.mlp": "fp8_delayed",
        "recipe.amax_history_len": 1, "recipe.amax_compute_algo": "max", "warmup_steps": 0,
        "clip_grad": 1.0, "memory.moment_dtype": "fp32", "memory.fp8_weights": True},
    11: {"precision.edge_blocks": "fp8_current", "precision.attention": "fp8_delayed", "precision.mlp": "fp8_current",
         "recipe.amax_history_len": 1024, "recipe.amax_compute_algo": "max", "warmup_steps": 0,
         "clip_grad": 1.0, "memory.moment_dtype": "fp32", "memory.fp8_weights": True},
}


def study_cases(space_file: Path | None) -> dict[str, Case]:
    """The study trials above, rebuilt from their params by the space that proposed them."""
    if space_file is None:
        return {}
    space = load_space(space_file)
    return {f"H200 study trial {n} ({space.study.name})": Case(policy_from_params(space, params),
                                                              param_dtype=space.probe.param_dtype)
            for n, params in STUDY_TRIALS.items()}


@dataclass
class Verdict:
    """One rung of a run read against the same rung of its BF16 reference (mean over seeds)."""

    gap: float
    tail_gap: float
    diverged: bool
    stable: bool
    tail_stable: bool
    steps: int
    eval_loss: float
    reason: str = ""


def verdict(results: list[ProbeResult], references: list[ProbeResult], limit: float) -> Verdict:
    """The seeds' mean final and tail gaps; diverged if any seed diverged."""
    diverged = any(r.diverged or not math.isfinite(r.eval_loss) for r in results)
    gaps = [r.eval_loss / ref.eval_loss - 1 for r, ref in zip(results, references)]
    tails = [tail_gap(r, ref, TAIL_FRACTION) for r, ref in zip(results, references)]
    gap, tail = (math.nan, math.nan) if diverged else (float(np.mean(gaps)), float(np.mean(tails)))
    return Verdict(gap=gap, tail_gap=tail, diverged=diverged, stable=not diverged and max(gap, 0.0) <= limit,
                   tail_stable=not diverged and max(tail, 0.0) <= limit, steps=len(results[0].losses),
                   eval_loss=float(np.mean([r.eval_loss for r in results])),
                   reason="; ".join(r.reason for r in results if r.reason))


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b (ties in either ranking corrected); NaN when either ranking is all ties."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = _cmp(x[i], x[j]), _cmp(y[i], y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denom if denom else math.nan


def _cmp(a: float, b: float) -> int:
    return (a > b) - (a < b)


def pretokenize(out: Path, n_tokens: int) -> Path:
    """The stdlib's source as byte tokens, saved as a uint16 ``.npy`` (the pre-tokenized corpus)."""
    path = out / "stdlib_bytes.npy"
    tokens = load_tokens("stdlib", max_tokens=n_tokens)
    np.save(path, tokens.numpy().astype(np.uint16))
    return path


def _settings(args) -> tuple[ModelConfig, ProbeSection, torch.device, str]:
    if args.smoke:
        cfg = ModelConfig(vocab_size=256, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=32)
        return cfg, ProbeSection(micro_batch=2, seq_len=32, lr=3e-3, device="cpu"), torch.device("cpu"), "emulated"
    cfg = ModelConfig(vocab_size=256, dim=args.dim, n_layers=args.layers, n_heads=args.dim // 64,
                      n_kv_heads=max(1, args.dim // 256), ffn_dim=args.dim * 7 // 2, max_seq_len=args.seq_len)
    probe = ProbeSection(micro_batch=args.micro_batch, seq_len=args.seq_len, lr=args.lr, device="cuda")
    if args.readings_on_cpu:  # the runs from the cache, the fixed-state readings taken here with emulated FP8
        return cfg, probe.model_copy(update={"device": "cpu"}), torch.device("cpu"), "emulated"
    if args.report_only:  # the runs are all in the cache: no GPU needed to read them
        return cfg, probe, torch.device("cpu"), "te"
    if not torch.cuda.is_available():
        raise SystemExit("bench_fidelity runs on a GPU; use --smoke on CPU")
    torch.cuda.set_device(args.gpu)
    return cfg, probe, torch.device("cuda", args.gpu), "te"


def run_in_rungs(cfg, base, policy, case, seed, rungs, data, backend, device, work: Path) -> list[ProbeResult]:
    """One run cut into rungs, each continuing the last from its checkpoint; a diverged rung ends it."""
    results, previous = [], None
    for i, steps in enumerate(rungs):
        save = str(work / f"rung{i}.pt") if i + 1 < len(rungs) else None
        leg = Leg(horizon=rungs[-1], resume_from=previous, save_to=save)
        result = run_probe(cfg, case.probe(base, steps, rungs[-1], seed), policy, data, backend, device, leg=leg)
        results.append(result)
        if result.diverged:
            return results + [result] * (len(rungs) - i - 1)  # later rungs read as diverged too
        previous = save
    return results


@dataclass(frozen=True)
class Job:
    """One training run cut into rungs: a policy's, or the BF16 reference of a group of cases, at one seed."""

    key: str  # file name of its cached result
    case: Case
    policy: Policy
    seed: int


def plan_jobs(chosen: dict[str, Case], seeds: int, rungs: list[int]) -> tuple[list[Job], dict]:
    """Every run the comparison needs, references first, and per case the keys of its (refs, runs).

    Keys are made from what a run is (the policy's name; a reference's lr, warm-up, clipping and
    dtype), so a cache filled by one subset (``--only``) serves another.
    """
    refs: dict[tuple, list[Job]] = {}
    runs: list[Job] = []
    layout = {}
    for name, case in chosen.items():
        group = case.reference_key()
        if group not in refs:  # BF16 at each seed, this case's lr, warm-up and clipping, cut the same way
            stem = _slug("ref " + " ".join(map(str, group)))
            refs[group] = [Job(f"{stem}-seed{s}", replace(case, seed=0), case.reference_policy(), s)
                           for s in range(seeds)]
        mine = [Job(f"{_slug(name)}-seed{s}", case, case.policy_for(rungs), s) for s in range(seeds)]
        runs += mine
        layout[name] = ([j.key for j in refs[group]], [j.key for j in mine])
    return [j for group in refs.values() for j in group] + runs, layout


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")


_WORKER: dict = {}


def _setup(args) -> dict:
    """What every run shares: model shape, probe settings, device, backend and the token batches."""
    cfg, base, device, backend_name = _settings(args)
    tokens = load_tokens("tokens", path=args.corpus, vocab_size=cfg.vocab_size)
    data = TokenBatches(tokens, seq_len=base.seq_len, micro_batch=base.micro_batch, seed=0,
                        eval_batches=args.eval_batches)
    return {"cfg": cfg, "base": base, "device": device, "backend": get_backend(backend_name, device), "data": data,
            "rungs": args.rungs, "work": Path(tempfile.mkdtemp(prefix="precsearch-fidelity-"))}


def _init_worker(args) -> None:
    _WORKER.update(_setup(args))


def _run_job(job: Job) -> list[dict]:
    """Run one job in this process; rungs as dicts (signals kept for the first rung only, no layer stats)."""
    w = _WORKER
    backend = w["backend"] if job.case.backend is None else planted_damage.backend(job.case.backend, w["device"])
    results = run_in_rungs(w["cfg"], w["base"], job.policy, job.case, job.seed, w["rungs"], w["data"],
                           backend, w["device"], w["work"] / job.key)
    return [r.to_dict() | {"layer_stats": [], "signals": r.signals if i == 0 else None}
            for i, r in enumerate(results)]


def run_jobs(args, jobs: list[Job]) -> dict[str, list[ProbeResult]]:
    """Run the jobs not yet in ``args.cache``, ``args.jobs`` at a time, each saved as it finishes.

    With several jobs at once they share the GPU (one process each: a small probe leaves it mostly
    idle). No job starts once ``args.deadline`` seconds could not hold it (judged by the slowest so
    far); what is left runs when the script is run again with the same cache.
    """
    _check_cache(args)
    done = {j.key: json.loads((args.cache / f"{j.key}.json").read_text()) for j in jobs
            if (args.cache / f"{j.key}.json").exists()}
    todo = [] if args.report_only or args.readings_on_cpu else [j for j in jobs if j.key not in done]
    print(f"{len(done)} of {len(jobs)} runs cached in {args.cache}; running {len(todo)}, {args.jobs} at a time",
          file=sys.stderr, flush=True)
    start, slowest = time.perf_counter(), 0.0

    def fits() -> bool:
        return args.deadline is None or time.perf_counter() - start + 1.1 * slowest < args.deadline

    def finish(job: Job, rungs: list[dict], began: float) -> None:
        nonlocal slowest
        slowest = max(slowest, time.perf_counter() - began)
        partial = args.cache / f"{job.key}.json.part"  # renamed when whole: a killed write leaves no bad file
        partial.write_text(json.dumps(rungs, default=str))
        partial.rename(args.cache / f"{job.key}.json")
        done[job.key] = rungs
        last = rungs[-1]
        print(f"  [{len(done)}/{len(jobs)}] {job.key} ({_describe(job)}): eval loss per rung "
              f"{[round(r['eval_loss'], 4) for r in rungs]}{' diverged' if last['diverged'] else ''} "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)

    if todo and args.jobs == 1:
        _init_worker(args)
        for job in todo:
            if not fits():
                break
            began = time.perf_counter()
            finish(job, _run_job(job), began)
    elif todo:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # the children's CPU threads: they mostly wait on the GPU
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_init_worker, initargs=(args,)) as pool:
            queue, running = list(todo), {}
            while queue or running:
                while queue and len(running) < args.jobs and fits():
                    job = queue.pop(0)
                    running[pool.submit(_run_job, job)] = (job, time.perf_counter())
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    job, began = running.pop(future)
                    if future.exception() is None:
                        finish(job, future.result(), began)
                    else:  # the others go on; this one stays missing (and its policy out of the table)
                        print(f"  {job.key} ({_describe(job)}) failed: {future.exception()!r}", file=sys.stderr,
                              flush=True)
    return {k: [ProbeResult.from_dict(r) for r in v] for k, v in done.items()}


def _check_cache(args) -> None:
    """The cache holds runs of one set of settings: refuse to mix in runs of other ones."""
    args.cache.mkdir(parents=True, exist_ok=True)
    keys = ("rungs", "seeds", "layers", "dim", "seq_len", "micro_batch", "lr", "clip", "tokens", "eval_batches",
            "smoke")
    settings = {k: getattr(args, k) for k in keys}
    path = args.cache / "settings.json"
    if path.exists() and json.loads(path.read_text()) != settings:
        raise SystemExit(f"{args.cache} holds runs of other settings ({path.read_text().strip()}); "
                         f"use another --cache")
    path.write_text(json.dumps(settings))


def _describe(job: Job) -> str:
    return f"init seed {job.seed + job.case.seed}, lr x{job.case.lr_multiplier:g}"


def run(args) -> dict:
    start = time.perf_counter()
    cfg, base, device, backend_name = _settings(args)
    args.out.mkdir(parents=True, exist_ok=True)
    corpus_dir = args.corpus_dir or Path(tempfile.mkdtemp(prefix="precsearch-corpus-"))
    corpus_dir.mkdir(parents=True, exist_ok=True)
    args.corpus = pretokenize(corpus_dir, args.tokens)
    chosen = judge_cases(args.clip) if args.judge else cases(args.clip)
    if args.smoke and args.judge:  # the control path of the judge: one benign, three planted (CPU: no memory knobs)
        chosen = {k: chosen[k] for k in ("fp8_delayed, blocks", "fp8_delayed, amax history 1",
                                         "planted: blocks' GEMMs at 0 mantissa bits",
                                         "nvfp4 without SR, RHT and 2D weights (emulated)")}
    elif args.smoke:  # the control, one FP8 policy, one fragile one with its own reference
        chosen = dict(list(chosen.items())[:2] + list(chosen.items())[-1:])
    elif not args.judge:
        chosen |= study_cases(args.study_space)
    if args.study_dir:
        chosen |= {name: Case(p) for name, p in front_policies(args.study_dir, args.top).items()}
    if args.only:  # a part of the comparison (same settings)
        chosen = {k: v for k, v in chosen.items() if any(o in k for o in args.only)}
    jobs, layout = plan_jobs(chosen, args.seeds, args.rungs)
    results = run_jobs(args, jobs)
    damage = damage_readings(args, chosen)
    rows, missing = [], []
    noise = long_noise(results, layout, chosen)
    for name, (ref_keys, run_keys) in layout.items():
        if all(k in results for k in ref_keys + run_keys):
            rows.append(_row(name, chosen[name], [results[k] for k in run_keys], [results[k] for k in ref_keys], args)
                        | {"damage": damage.get(name)})
        else:
            missing.append(name)
    ran_on = next((r[0].device for r in results.values() if r), "cpu")
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else ran_on,
            "torch": torch.__version__, "transformer_engine": te_version(), "backend": backend_name,
            "date": datetime.date.today().isoformat(), "model": cfg.__dict__ | {"rope_scaling": str(cfg.rope_scaling)},
            "probe": base.model_dump(mode="json"), "rungs": args.rungs, "seeds": args.seeds,
            "short_steps": args.rungs[0], "long_steps": args.rungs[-1], "tail_fraction": TAIL_FRACTION,
            "corpus": {"path": str(args.corpus), "tokens": args.tokens, "source": "stdlib bytes, .npy"},
            "readings_on": "cpu, emulated FP8" if args.readings_on_cpu else None,
            "parallel_runs": args.jobs, "wall_s": time.perf_counter() - start, "missing": missing,
            "long_noise": noise}
    summary = summarise(rows, args.limit, noise) if rows else {}
    if rows:
        summary["judge"] = judge_readings(rows)
    return {"meta": meta, "summary": summary, "rows": rows}


def damage_readings(args, chosen: dict[str, Case]) -> dict[str, dict]:
    """Each case's fixed-state reading (every figure of :data:`MEASURES`), cached as ``damage-<case>.json``.

    The states are the BF16 reference's in the first rung (its middle and end), trained as that rung is
    (the long run's schedule); the reading is for the bench's own tokens per step (the truth trains at it).
    """
    todo = {n: c for n, c in chosen.items() if not (args.cache / f"damage-{_slug(n)}.json").exists()}
    if todo and not args.report_only:
        cfg, base, device, backend_name = _settings(args)
        tokens = load_tokens("tokens", path=args.corpus, vocab_size=cfg.vocab_size)
        data = TokenBatches(tokens, seq_len=base.seq_len, micro_batch=base.micro_batch, seed=0,
                            eval_batches=args.eval_batches)
        first, last = args.rungs[0], args.rungs[-1]
        settings = DamageSection(states=[first / 2 / last, first / last], batches=args.damage_batches,
                                 tokens_per_step=base.micro_batch * base.seq_len)
        readers: dict[tuple, DamageReader] = {}
        for name, case in todo.items():
            key = case.reference_key() + (case.backend,)
            if key not in readers:
                backend = planted_damage.backend(case.backend or backend_name, device)
                readers[key] = DamageReader(cfg, case.probe(base, last, last, 0), data, backend, device, settings,
                                            baseline=case.baseline_memory)
            began = time.perf_counter()
            reading = readers[key].read(case.policy_for(args.rungs))
            (args.cache / f"damage-{_slug(name)}.json").write_text(json.dumps(reading))
            print(f"  damage reading of {name}: {reading['value']:.4g} ({time.perf_counter() - began:.1f} s)",
                  file=sys.stderr, flush=True)
    found = {n: args.cache / f"damage-{_slug(n)}.json" for n in chosen}
    return {n: json.loads(p.read_text()) for n, p in found.items() if p.exists()}


#: Each reading's limit (above it: unstable), fixed before the judge ran: relative loss gaps at the bench's
#: --limit; the risk score at its own threshold; each damage figure at the limit a study gives it by default
#: (DEFAULT_LIMITS; update_norm's was set, at grad_norm's, after the judge's first H200 run and before it was read).
DAMAGE_LIMITS = DEFAULT_LIMITS
assert DAMAGE_LIMITS["forward"] == fidelity_judge.TOLERANCE  # forward at the truth's own tolerance


def judge_readings(rows: list[dict]) -> dict:
    """Every reading judged against the long run's truth (see :mod:`fidelity_judge`)."""
    rows = [r for r in rows if r["seed_offset"] == 0]  # a BF16 control differs by its init, not its precision
    names = [r["policy"] for r in rows]
    truths = [fidelity_judge.truth(r["long_gaps"], r["long"]["diverged"]) for r in rows]
    limit = rows[0]["limit"]
    readings = {"short loss gap": ([_rank(r["short"]) for r in rows], limit),
                "short tail gap": ([math.inf if r["short"]["diverged"] else r["short"]["tail_gap"] for r in rows],
                                   limit),
                "promoted loss gap": ([_rank(r["promoted"]) for r in rows], limit),
                "risk score": ([r["risk"] for r in rows], THRESHOLD)}
    if all(r.get("damage") for r in rows):
        for measure in MEASURES:
            readings[f"damage {measure}"] = ([_worst_state(r["damage"], measure) for r in rows],
                                             DAMAGE_LIMITS[measure])
    graded = [name.startswith(PLANTED) for name in names]
    out = {name: fidelity_judge.judge(names, truths, values, lim, graded) for name, (values, lim) in readings.items()}
    return {"truth": dict(zip(names, truths)), "tolerance": fidelity_judge.TOLERANCE, "readings": out}


def _worst_state(reading: dict, measure: str) -> float:
    return max(s["total"][measure][0] for s in reading["states"])


def long_noise(results: dict[str, list[ProbeResult]], layout: dict, chosen: dict[str, Case]) -> float:
    """The long rung's BF16 run-to-run spread: relative sample std of the held-out losses of every BF16 run
    with the bench's own settings (the control's references and the control's runs); NaN if fewer than 3.

    A long gap within two of these is not a verdict either way (two BF16 runs differ that much).
    """
    control = next((n for n, c in chosen.items() if not c.policy.rules and c.policy.default is Precision.BF16), None)
    if control is None:
        return math.nan
    keys = [k for k in layout[control][0] + layout[control][1] if k in results]
    losses = np.array([results[k][-1].eval_loss for k in keys if not results[k][-1].diverged])
    return float(losses.std(ddof=1) / losses.mean()) if len(losses) >= 3 else math.nan


def _row(name: str, case: Case, runs: list[list[ProbeResult]], refs: list[list[ProbeResult]], args) -> dict:
    """Per rung the verdict over seeds; the first rung's risk score (seed 0, BF16 seeds' spread)."""
    rungs = [verdict([r[i] for r in runs], [r[i] for r in refs], args.limit) for i in range(len(args.rungs))]
    spread = seed_spread([Signals.from_dict(r[0].signals) for r in refs if r[0].signals])
    first, ref = runs[0][0], refs[0][0]
    risk = risk_score(Signals.from_dict(first.signals), Signals.from_dict(ref.signals), spread=spread) \
        if first.signals and ref.signals else None
    promoted = rungs[1] if len(rungs) > 2 else rungs[0]
    long_gaps = [r[-1].eval_loss / ref[-1].eval_loss - 1 for r, ref in zip(runs, refs)]
    return {"policy": name, "long_gaps": long_gaps, "limit": args.limit, "detail": case.policy.to_dict(), "lr_multiplier": case.lr_multiplier,
            "lr_warmup": case.lr_warmup, "seed_offset": case.seed, "fragile": case.fragile,
            "rungs": [vars(v) for v in rungs], "short": vars(rungs[0]), "promoted": vars(promoted),
            "long": vars(rungs[-1]), "risk": risk.score if risk else math.nan,
            "risk_excess": risk.excess if risk else {},
            "flagged_before_long": (not rungs[0].stable or not promoted.stable or not rungs[0].tail_stable
                                    or bool(risk and risk.risky))}


def _rank(v: dict) -> float:
    return math.inf if v["diverged"] else v["gap"]  # a diverged run is worse than any gap


def summarise(rows: list[dict], limit: float, noise: float = math.nan) -> dict:
    """Tau-b against the long gap and stable/unstable agreement, for each early reading.

    Also, where the long rung's BF16 spread ``noise`` is known, agreement on the *decided* policies only:
    those whose long gap is beyond two spreads either way (worse: unstable; better: stable) or that
    diverged. Elsewhere the long run itself cannot tell stable from unstable at the limit.
    """
    truth = [_rank(r["long"]) for r in rows]
    unstable = [not r["long"]["stable"] for r in rows]
    decided = [i for i, r in enumerate(rows) if r["long"]["diverged"] or abs(r["long"]["gap"]) > 2 * noise]
    readings = {
        "short": ([_rank(r["short"]) for r in rows], [not r["short"]["stable"] for r in rows]),
        "short_tail": ([math.inf if r["short"]["diverged"] else max(r["short"]["tail_gap"], 0.0) for r in rows],
                       [not r["short"]["tail_stable"] for r in rows]),
        "promoted": ([_rank(r["promoted"]) for r in rows], [not r["promoted"]["stable"] for r in rows]),
        "risk_score": ([r["risk"] for r in rows], [r["risk"] >= THRESHOLD for r in rows]),
        "promoted_or_risk": ([_rank(r["promoted"]) for r in rows],
                             [not r["promoted"]["stable"] or r["risk"] >= THRESHOLD for r in rows]),
    }
    out = {name: {"kendall_tau": kendall_tau(values, truth),
                  "agreement": sum(f == u for f, u in zip(flags, unstable)) / len(rows),
                  "decided_agreement": (sum(flags[i] == (truth[i] > 0) for i in decided) / len(decided)
                                        if decided else math.nan)}
           for name, (values, flags) in readings.items()}
    fragile = [r for r in rows if r["fragile"]]
    return out | {"n_policies": len(rows), "limit": limit, "long_noise": noise,
                  "decided": [rows[i]["policy"] for i in decided],
                  "kendall_tau": out["short"]["kendall_tau"], "agreement": out["short"]["agreement"],
                  "fragile_flagged_before_long": {r["policy"]: r["flagged_before_long"] for r in fragile}}


def _fmt(gap: float, diverged: bool) -> str:
    return "diverged" if diverged else f"{100 * gap:+.2f}%"


def format_table(report: dict) -> str:
    rungs = report["meta"]["rungs"]
    head = " ".join(f"{f'{n} steps':>17}" for n in rungs)
    lines = [f"{'policy':46s} {head} {'risk':>5}  (gap final / tail per rung; * unstable)"]
    if report["meta"].get("readings_on"):
        lines.insert(0, f"runs on {report['meta']['device']}; fixed-state readings on {report['meta']['readings_on']}")
    for r in report["rows"]:
        cells = " ".join(f"{_fmt(v['gap'], v['diverged']):>8}/{_fmt(v['tail_gap'], v['diverged']):>8}"
                         + ("*" if not v["stable"] else " ") for v in r["rungs"])
        lines.append(f"{r['policy']:46s} {cells} {r['risk']:5.2f}")
    s = report["summary"]
    lines.append(f"against the {rungs[-1]}-step final gap (mean of {report['meta']['seeds']} seeds), limit "
                 f"{100 * s['limit']:.1f}%:")
    decided = len(s.get("decided", []))
    for name in ("short", "short_tail", "promoted", "risk_score", "promoted_or_risk"):
        lines.append(f"  {name:18s} Kendall tau-b {s[name]['kendall_tau']:+.3f}   stable/unstable agreement "
                     f"{100 * s[name]['agreement']:.0f}% of {s['n_policies']}; on the {decided} decided: "
                     f"{100 * s[name].get('decided_agreement', math.nan):.0f}%")
    lines.append(f"long-run BF16 spread {100 * s.get('long_noise', math.nan):.2f}%; decided (long gap beyond 2 "
                 f"spreads, or diverged): {', '.join(s.get('decided', [])) or 'none'}")
    if "judge" in s:
        lines += judge_table(s["judge"], report["meta"]["seeds"])
    flagged = s["fragile_flagged_before_long"]
    lines.append(f"fragile policies flagged before the long run: {sum(flagged.values())} of {len(flagged)} "
                 + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in flagged.items()))
    return "\n".join(lines)


def judge_table(j: dict, seeds: int) -> list[str]:
    """The judge's lines: the truth per policy, then each reading's Spearman and calls."""
    lines = [f"truth: long-run paired gap, mean of {seeds} seeds ± SE; decided beyond 2 SE of the "
             f"{100 * j['tolerance']:.2f}% tolerance:"]
    for name, t in j["truth"].items():
        gap = "diverged" if math.isinf(t["mean"]) else f"{100 * t['mean']:+.3f}% ± {100 * t['se']:.3f}%"
        lines.append(f"  {name:46s} {gap:>20}  {t['call']}")
    target = next(iter(j["readings"].values()), {}).get("target", [])
    lines.append(f"  Spearman: over all {len(j['truth'])} policies, and over the {len(target)} of the target set "
                 f"(planted graded series + decided)")
    lines.append(f"  {'reading':26s} {'Spearman':>8} {'target':>7}  {'limit':>7}  right/decided  false-stable  "
                 f"false-unstable")
    for name, r in j["readings"].items():
        lines.append(f"  {name:26s} {r['spearman']:+8.3f} {r.get('spearman_target', math.nan):+7.3f}  "
                     f"{r['limit']:7.4g}  {r['right']:>5}/{r['decided']:<7} "
                     f"{len(r['false_stable']):>12}  {len(r['false_unstable']):>14}"
                     + (f"  (false-stable: {', '.join(r['false_stable'])})" if r["false_stable"] else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rungs", type=int, nargs="+", default=[50, 200, 2000],
                    help="steps at each rung: the probe, the promoted probe(s), the long run (>= 10x the probe)")
    ap.add_argument("--seeds", type=int, default=2, help="init seeds every run and reference is trained with")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping of the non-fragile policies")
    ap.add_argument("--limit", type=float, default=0.01, help="stable if the loss gap is at most this")
    ap.add_argument("--tokens", type=int, default=8 * 2**20, help="bytes of stdlib source in the corpus")
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--corpus-dir", type=Path, help="where the .npy token file is written (default: a temp dir)")
    ap.add_argument("--study-dir", type=Path, help="add this finished study's front policies")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device index (or set CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    ap.add_argument("--study-space", type=Path, default=Path("search_spaces/llama3_8b_h100.yaml"),
                    help="the space STUDY_TRIALS' params are read with (their policies join the comparison)")
    ap.add_argument("--only", nargs="+", help="run only the policies whose name contains one of these")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (processes sharing the one GPU)")
    ap.add_argument("--cache", type=Path, help="each finished run is saved here and not run again "
                    "(default: OUT/fidelity_runs); split a long comparison over calls with the same cache")
    ap.add_argument("--deadline", type=float, help="start no run that would end after this many seconds")
    ap.add_argument("--report-only", action="store_true", help="run nothing: the report from the runs in --cache")
    ap.add_argument("--judge", action="store_true", help="the judge's policies (benign and graded planted damage, "
                    "judge_cases) instead of the full comparison")
    ap.add_argument("--readings-on-cpu", action="store_true", help="run no training: the runs from --cache (a "
                    "GPU's), the fixed-state readings missing from it taken on this CPU with emulated FP8")
    ap.add_argument("--damage-batches", type=int, default=8, help="batches per state of the fixed-state reading")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU (emulated FP8): the code path, < 60 s")
    args = ap.parse_args(argv)
    args.cache = args.cache or args.out / "fidelity_runs"
    if args.smoke:
        args.rungs, args.seeds, args.tokens, args.eval_batches = [12, 30, 120], 2, 2**16, 1
    if sorted(set(args.rungs)) != args.rungs or len(args.rungs) < 2:
        ap.error(f"--rungs must be increasing, at least two of them (got {args.rungs})")
    if args.rungs[-1] < 10 * args.rungs[0]:
        ap.error(f"the last rung ({args.rungs[-1]}) must be at least 10x the first ({args.rungs[0]})")
    report = run(args)
    stem = f"{report['meta']['date']}_bench_fidelity{'_smoke' if args.smoke else ''}"
    if report["meta"]["missing"]:  # some runs not done yet: no summary until every case has its runs
        print(f"incomplete: {len(report['meta']['missing'])} policies still miss runs; run again with "
              f"--cache {args.cache}")
        stem += "_partial"
    else:
        print(format_table(report))
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
