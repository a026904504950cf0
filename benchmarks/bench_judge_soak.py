"""The fixed-state reading judged on the soak's truth (issue 54, item 3).

Truth: the soak (``bench_soak.py``), 2,000-step annealed paired runs, 8 seeds: each combination's call at the
soak's detection limit and at the 0.25% tolerance (``non-finite`` where a run went NaN, ``damaging`` where it
diverged or its gap is beyond 2 SE above the limit, ``benign`` beyond 2 SE below, else ``undecided``), read from
its report JSON (or summarised from a run cache JSONL), plus the late-onset case the soak no longer holds:
**the NaN before its fix** (an FP32 master with ``fp8_block`` moments: 4 of 8 seeds NaN at steps 1,100-1,700 on
an H100, 2026-12-06, ``docs/memory.md``), whose truth is that record (:data:`PRE_FIX_TRUTH`).

The reading: ONE long BF16 run with the soak's exact set-up (``bench_soak.setup``, ``build``, ``train``: its
model, data, annealed schedule, ``FP8StateAdamW`` with an FP32 master and FP32 moments, clipping 1.0; seed 0),
its state kept before step ``--probe-step`` (a probe's length, inside the warm-up) and at ``--states`` fractions
of the run (default 25% and 50% at the constant lr, 75% where the decay starts, 95% near its end). A state is the FP32
master weights, the FP32 moments and the step (``precsearch.probe.damage.states.State``), the weights renamed
from ``bench_stack.Reference``'s TE modules to precsearch's Llama (the same Megatron layout: a layout check
compares the two models' held-out loss at the first late state). At each state every case is read by
precsearch's own fixed-state reading (:class:`~precsearch.probe.damage.DamageReader` with the BF16 side taken at
the given state instead of its own run; ``bench_fidelity.py --judge`` reads the same way): every soak
combination (optimizer-state knobs as ``MemoryKnobs``, GEMM recipes as FP8 on the blocks, as the soak's
``te.autocast`` over the TE layers does), the pre-fix case, and the graded planted series
(``planted_damage.py``, no soak truth: ranked, not judged).

**The pre-fix case** is ``std_fp32_fp8block`` read with the pre-fix arithmetic planted in this bench only:
``fp8_state_adam.MIN_AMAX`` set to the smallest float32 (the old ``amax > 0`` rule) while its reading runs, so the
reading's ``fp8_block`` storage (the optimizer's own ``quantize_state``) scales a block of amax under 1.3e-36 by
inf again. Whether it can show at a state depends on that state's moments: each state's census counts the
blocks of every parameter's first moment (units or not: the embedding is not a precision unit) below 1.3e-36
and below ``MIN_AMAX``. A planted **starved state** (the last state, one block of one unit's moments decayed as
``--starve-steps`` steps without a gradient would) shows what the reading does when such a block is in a unit.

Each reading's call: ``non-finite`` when the policy's side is non-finite, ``unstable`` when the measure (default
``update_norm``, the study default) is above its limit (``DEFAULT_LIMITS``, what a study uses), else ``stable``;
with the band of :mod:`precsearch.instability`. False-stable: a case the truth decides as damaging or non-finite
that the reading calls stable, at the probe's state, at the late states (unstable at any), and over all.
"Could not see" lines name each. Prints a table and writes ``<date>_bench_judge_soak[_smoke].json`` in ``--out``.

    python benchmarks/bench_judge_soak.py --out $OUT                              # GPU: TE, the soak's size
    python benchmarks/bench_judge_soak.py --smoke --out /tmp/js                   # CPU: toy Llama, emulated FP8, < 2 min
    bash benchmarks/gpu/gpu_judge_soak.sh                                             # on one H100
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_soak as soak  # noqa: E402
import planted_damage  # noqa: E402

from precsearch.arch.units import unit_names  # noqa: E402
from precsearch.backends import fp8_state_adam  # noqa: E402
from precsearch.config.damage_section import DEFAULT_LIMITS  # noqa: E402
from precsearch.config.space import DamageSection, ProbeSection  # noqa: E402
from precsearch.instability import Reading, StudyUnit  # noqa: E402
from precsearch.policy import MemoryKnobs, Policy, Rule  # noqa: E402
from precsearch.precision import Precision  # noqa: E402
from precsearch.probe.damage import MEASURES, DamageReader  # noqa: E402
from precsearch.probe.damage.reading import side_grams  # noqa: E402
from precsearch.probe.damage.states import State  # noqa: E402
from precsearch.probe.data import TokenBatches  # noqa: E402

TRUTH = Path(__file__).resolve().parent / "results" / "2026-12-07_bench_soak.json"
BLOCKS = "decoder.layers.*"
CLIP = 1.0  # the soak clips every run's gradients to 1.0
#: The soak's pair: BF16 compute, FP32 master weights and moments; every case is read against it.
STANDARD = MemoryKnobs(master_weights=True, moment_dtype="fp32")
RECIPES = {p.value: p for p in Precision if p.is_fp8}
PRE_FIX = "std_fp32_fp8block, pre-fix arithmetic"
#: The pre-fix NaN's truth: the soak's first call of std_fp32_fp8block, before the tiny-moment fix (docs/memory.md).
PRE_FIX_TRUTH = {"call": "non-finite", "non_finite_runs": 4, "runs": 8, "gap_pct": math.nan, "se_pct": math.nan,
                 "source": "H100 2026-12-06, before the MIN_AMAX fix: 4 of 8 seeds NaN at steps 1,100-1,700 "
                           "(docs/memory.md, 'The NaN of fp8_block moments after a thousand steps')"}
#: The pre-fix rule ``amax > 0`` as a floor: the smallest float32 (a subnormal), so only an amax of 0 keeps scale 1.
PRE_FIX_MIN_AMAX = 2.0**-149
#: Below this a block's ``1 / (amax / 448)`` overflows FP32 (the pre-fix NaN); ``MIN_AMAX`` (5.3e-36) is the GPU's
#: flush of ``amax / 448``.
OVERFLOW_AMAX = 448 / torch.finfo(torch.float32).max
PLANTED = "planted: blocks' GEMMs at {} mantissa bits"
HARMFUL = ("damaging", "non-finite")
#: The layout check's bound: the trained model and the Llama at its kept weights differ by BF16 kernels only.
LAYOUT_TOLERANCE = 0.01
DECIDED = ("damaging", "non-finite", "benign")

#: bench_stack.Reference's parameter names (TE modules) -> precsearch's Llama (Megatron layout, the same tensors:
#: the fused QKV grouped per KV head as TE's qkv_weight_interleaved, fc1 as [gate, up]).
TE_NAMES = [
    (r"embed\.weight", "embedding.word_embeddings.weight"),
    (r"norm\.weight", "decoder.final_layernorm.weight"),
    (r"head\.weight", "output_layer.weight"),
    (r"layers\.(\d+)\.self_attention\.layernorm_qkv\.layer_norm_weight",
     r"decoder.layers.\1.self_attention.linear_qkv.layer_norm_weight"),
    (r"layers\.(\d+)\.self_attention\.layernorm_qkv\.weight", r"decoder.layers.\1.self_attention.linear_qkv.weight"),
    (r"layers\.(\d+)\.self_attention\.proj\.weight", r"decoder.layers.\1.self_attention.linear_proj.weight"),
    (r"layers\.(\d+)\.layernorm_mlp\.layer_norm_weight", r"decoder.layers.\1.mlp.linear_fc1.layer_norm_weight"),
    (r"layers\.(\d+)\.layernorm_mlp\.fc1_weight", r"decoder.layers.\1.mlp.linear_fc1.weight"),
    (r"layers\.(\d+)\.layernorm_mlp\.fc2_weight", r"decoder.layers.\1.mlp.linear_fc2.weight"),
]


def llama_name(name: str, smoke: bool) -> str:
    """A trained parameter's name in precsearch's Llama (the smoke trains that model: its own names)."""
    if smoke:
        return name
    for pattern, to in TE_NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, to, name)
    raise KeyError(f"no Llama name for {name!r} (bench_stack.Reference's parameters changed? see TE_NAMES)")


# ---- the truth -----------------------------------------------------------------------------------------------


def _call(row: dict, key: str) -> str:
    if row["non_finite"]:
        return "non-finite"
    if row["diverged"]:
        return "damaging"
    return row[key]


def soak_truth(path: Path, steps: int) -> dict:
    """Each soak combination's calls (``at_limit``: the soak's detection limit; ``at_tolerance``: 0.25%), and the
    pre-fix case's; from the soak's report JSON, or its run cache (``.jsonl``, runs of ``steps`` steps)."""
    if path.suffix == ".jsonl":
        report = soak.summarise(soak.load_cache(path, soak.setup(steps)))
    else:
        report = json.loads(path.read_text())
    cases = {}
    for name in soak.COMBOS:
        row = report["rows"].get(name)
        if name in soak.BASES:
            continue
        if row is None:
            cases[name] = {"at_limit": "not run", "at_tolerance": "not run", "gap_pct": math.nan, "se_pct": math.nan,
                           "runs": 0}
            continue
        cases[name] = {"at_limit": _call(row, "at_detection_limit"), "at_tolerance": _call(row, "at_tolerance"),
                       "gap_pct": row["gap_pct"], "se_pct": row["se_pct"], "runs": row["runs"],
                       "non_finite_runs": len(row["non_finite"]), "diverged_runs": row["diverged"]}
    cases[PRE_FIX] = {"at_limit": PRE_FIX_TRUTH["call"], "at_tolerance": PRE_FIX_TRUTH["call"]} | PRE_FIX_TRUTH
    return {"source": str(path), "detection_limit_pct": report["detection_limit_pct"],
            "tolerance_pct": report["tolerance_pct"], "date": report.get("date"), "device": report.get("device"),
            "cases": cases}


# ---- the cases -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One reading: a policy, the backend it is read with (None: the bench's), its truth's key, pre-fix or not."""

    policy: Policy
    backend: str | None = None
    truth: str | None = None
    pre_fix: bool = False


def policy_of(combo: soak.Combo) -> Policy:
    """A soak combination as a policy: FP8 GEMMs on the blocks (the soak's autocast covers the TE layers, not the
    BF16 head), its optimizer state as memory knobs, clipping 1.0."""
    rules = () if combo.recipe == "bf16" else (Rule("fp8", (BLOCKS,), RECIPES[combo.recipe]),)
    moments = dict(moment_dtype=combo.exp_avg) if combo.exp_avg == combo.exp_avg_sq else dict(
        moment_dtype="fp32", exp_avg_dtype=combo.exp_avg, exp_avg_sq_dtype=combo.exp_avg_sq)
    master = dict(master_weights=False) if combo.master == "none" else dict(master_weights=True,
                                                                             master_dtype=combo.master)
    return Policy(rules=rules, clip_grad=CLIP, memory=MemoryKnobs(fp8_weights=combo.fp8_weights, **master, **moments))


def judge_cases(planted_bits: list[int]) -> dict[str, Case]:
    """Every soak combination but the pair, the pre-fix case, the graded planted series."""
    out = {name: Case(policy_of(c), backend="emulated" if c.model == "emulated" else None, truth=name)
           for name, c in soak.COMBOS.items() if name not in soak.BASES}
    out[PRE_FIX] = Case(policy_of(soak.COMBOS["std_fp32_fp8block"]), truth=PRE_FIX, pre_fix=True)
    for bits in planted_bits:
        out[PLANTED.format(bits)] = Case(Policy(rules=(Rule("fp8", (BLOCKS,), Precision.FP8_CURRENT),), clip_grad=CLIP),
                                         backend=f"{planted_damage.PREFIX}{bits}")
    return out


@contextlib.contextmanager
def pre_fix_arithmetic(on: bool):
    """While on: ``FP8StateAdamW``'s storage rule before the tiny-moment fix (scale 1 only for an amax of 0)."""
    kept = fp8_state_adam.MIN_AMAX
    if on:
        fp8_state_adam.MIN_AMAX = PRE_FIX_MIN_AMAX
    try:
        yield
    finally:
        fp8_state_adam.MIN_AMAX = kept


# ---- the long BF16 run and its states ------------------------------------------------------------------------


def census(named: dict[str, tuple[torch.Tensor, bool]]) -> dict:
    """Per parameter whose first moment holds a tiny ``fp8_block`` block: the blocks with 0 < amax < 1.3e-36 (the
    pre-fix overflow), below ``MIN_AMAX``, the smallest non-zero block amax; ``named``: name -> (exp_avg, is_unit)."""
    out = {}
    for name, (m, is_unit) in named.items():
        amax = fp8_state_adam.as_blocks(m.float()).abs().amax(dim=1)
        nonzero = amax[amax > 0]
        overflow = int(((amax > 0) & (amax < OVERFLOW_AMAX)).sum())
        below = int(((amax > 0) & (amax < fp8_state_adam.MIN_AMAX)).sum())
        if overflow or below:
            out[name] = {"unit": is_unit, "blocks_overflow": overflow, "blocks_below_min_amax": below,
                         "smallest_amax": float(nonzero.min()) if nonzero.numel() else 0.0}
    return out


class Keeper:
    """``bench_soak.train``'s ``on_state``: keeps the run's state before each step in ``at`` (a
    :class:`~precsearch.probe.damage.states.State` in precsearch's names) with its moment census, and at
    ``check_at`` compares the trained model's held-out loss with the Llama's at the kept weights (the layout)."""

    def __init__(self, s: soak.Setup, cfg, at: list[int], check_at: int, device: torch.device, backend,
                 seed: int = 0):
        self.s, self.cfg, self.at, self.check_at, self.device, self.backend = s, cfg, set(at), check_at, device, backend
        self.seed = seed
        self.states: list[State] = []
        self.census: dict[int, dict] = {}
        self.layout: dict = {}
        self.units = set(unit_names(cfg))

    def __call__(self, step: int, model, opt) -> None:
        if step not in self.at:
            return
        params = {llama_name(n, self.s.smoke): p for n, p in model.named_parameters() if p.numel()}
        weights = {n: opt.state[p].get("master_param", p).detach().float().clone() for n, p in params.items()}
        moments = {u: tuple(opt.state[params[f"{u}.weight"]][k].detach().float().clone()
                            for k in ("exp_avg", "exp_avg_sq")) for u in self.units} if step else {}
        state = State(step=step, weights=weights, moments=moments, lr=soak.lr_at(step, self.s))
        self.states.append(state)
        self.census[step] = census({n: (opt.state[p]["exp_avg"], n.removesuffix(".weight") in self.units)
                                    for n, p in params.items()})
        if step == 0:
            self._check_names(weights)
        if step == self.check_at:
            self.layout = self._layout(model, state)

    def _check_names(self, weights: dict) -> None:
        """Before training on: the kept weights are exactly precsearch's Llama's, tensor for tensor."""
        from precsearch.probe.model.llama3 import Llama3

        with torch.device("meta"):
            want = {k: tuple(v.shape) for k, v in Llama3(self.cfg).state_dict().items()}
        have = {k: tuple(v.shape) for k, v in weights.items()}
        if want != have:
            raise SystemExit(f"the kept state is not precsearch's Llama: missing {sorted(set(want) - set(have))}, "
                             f"extra {sorted(set(have) - set(want))}, shapes differ "
                             f"{sorted(k for k in set(want) & set(have) if want[k] != have[k])}")

    def _layout(self, model, state: State) -> dict:
        """The trained model's and the Llama's held-out loss on the soak's held-out batch 0 at this state."""
        from precsearch.probe.damage.states import state_model

        data = soak.stdlib_bytes()
        ids, targets = soak.batch(data, self.s, self.seed, 0, True, str(self.device))
        with torch.no_grad():
            trained = float(soak.forward(model, ids, targets, soak.COMBOS[soak.BASE], self.s))
            llama = state_model(self.cfg, state, Policy.bf16(CLIP, STANDARD), self.backend, self.device,
                                reading_probe(self.s, self.device))
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                mine = float(llama(ids, targets))
        return {"step": state.step, "trained_model_loss": trained, "llama_at_state_loss": mine,
                "relative_difference": mine / trained - 1}


def reading_probe(s: soak.Setup, device: torch.device) -> ProbeSection:
    """The probe settings the reading takes: the soak's batch, AdamW and BF16 parameters."""
    return ProbeSection(micro_batch=s.mb, seq_len=s.seq, lr=s.lr, steps=s.steps, betas=soak.BETAS,
                        weight_decay=soak.WEIGHT_DECAY, param_dtype="bf16", seed=0, device=device.type)


def starved(state: State, unit: str, steps: int) -> State:
    """``state`` with the first ``QBLOCK`` elements of ``unit``'s moments decayed as ``steps`` steps without a
    gradient decay them (``beta1^steps``, ``beta2^steps``), every other one of them 0: the tiny block of a starved
    parameter as the ``fp8_block`` run that went NaN held it, planted. The zeros are its zero codes (a sparse
    gradient's, or values below E4M3's range under the block's scale: ``tests/_starve.py``); the pre-fix NaN was
    ``0 * inf`` on them (a non-zero value times an infinite scale saturates on a CPU)."""
    b1, b2 = soak.BETAS
    m, v = (t.clone() for t in state.moments[unit])
    n = fp8_state_adam.QBLOCK
    m.view(-1)[:n] *= b1**steps
    m.view(-1)[:n:2] = 0.0
    v.view(-1)[:n] *= b2**steps
    return replace(state, moments=state.moments | {unit: (m, v)})


# ---- the reading ---------------------------------------------------------------------------------------------


class StateReader(DamageReader):
    """precsearch's reader with its BF16 side taken at a given state (the soak run's) instead of its own run."""

    def __init__(self, state: State, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state = state

    def bf16_sides(self, clip_grad):
        if clip_grad not in self._bf16:
            side = self._side(self.state, Policy.bf16(clip_grad, self.baseline))
            side.grams = side_grams(side, self.state, self.probe, self.settings, self.device)
            self._bf16[clip_grad] = [(self.state, side)]
            self.states_on[clip_grad] = self.device.type
        return self._bf16[clip_grad]


def call_of(reading: dict, measure: str) -> dict:
    """The reading's value at its one state, its call and its band (precsearch.instability)."""
    state = reading["states"][0]["total"]
    value, se = state[measure]
    limit = DEFAULT_LIMITS[measure]
    if reading["nonfinite"] or not math.isfinite(value):
        call = "non-finite"
    else:
        call = "unstable" if value > limit else "stable"
    band = Reading(value, se, StudyUnit("damage", limit, measure)).band
    return {"value": value, "se": se, "limit": limit, "call": call, "band": band}


def read_all(cases: dict[str, Case], states: dict[str, State], s: soak.Setup, cfg, device: torch.device,
             bench_backend: str, batches: int, measure: str) -> dict[str, dict[str, dict]]:
    """Every case at every state: per case, per state label, the call of each figure and the main one's."""
    data = TokenBatches(soak.stdlib_bytes(), seq_len=s.seq, micro_batch=s.mb, seed=0, eval_batches=s.eval_batches)
    settings = DamageSection(batches=batches, tokens_per_step=s.mb * s.seq, measure=measure, keep_states="device",
                             compile_compare=False)
    probe = reading_probe(s, device)
    out: dict[str, dict[str, dict]] = {name: {} for name in cases}
    for label, state in states.items():
        readers: dict[str, StateReader] = {}
        began_state = time.perf_counter()
        for name, case in cases.items():
            key = case.backend or bench_backend
            began = time.perf_counter()
            try:
                if key not in readers:
                    readers[key] = StateReader(state, cfg, probe, data, planted_damage.backend(key, device), device,
                                               settings, baseline=STANDARD)
                with pre_fix_arithmetic(case.pre_fix):
                    reading = readers[key].read(case.policy)
            except Exception as e:  # a case the backend cannot read is a result too: it names the case
                out[name][label] = {"error": f"{type(e).__name__}: {e}"}
                print(f"  {label} {name}: error {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                continue
            out[name][label] = {"main": call_of(reading, measure), "nonfinite": reading["nonfinite"],
                                "figures": {m: call_of(reading, m) for m in MEASURES},
                                "seconds": time.perf_counter() - began}
        del readers
        print(f"  read {len(cases)} cases at {label} ({time.perf_counter() - began_state:.0f} s)", file=sys.stderr,
              flush=True)
    return out


# ---- the judge -----------------------------------------------------------------------------------------------


def unstable(cell: dict | None, figure: str | None = None) -> bool | None:
    """Whether a reading called the case unstable (non-finite included); None where it failed."""
    if not cell or "error" in cell:
        return None
    c = cell["figures"][figure] if figure else cell["main"]
    return c["call"] != "stable"


def judge(truth: dict, readings: dict, cases: dict[str, Case], groups: dict[str, list[str]], level: str,
          figure: str | None = None) -> dict:
    """Per group of states: the decided cases, false-stable (harmful by the truth, stable at every state of the
    group), false-unstable (benign by the truth, unstable at any state), unread (a reading failed)."""
    out = {}
    for group, labels in groups.items():
        decided, false_stable, false_unstable, unread = [], [], [], []
        for name, case in cases.items():
            t = truth["cases"].get(case.truth or "", {}).get(level)
            if t not in DECIDED:
                continue
            flags = [unstable(readings[name].get(lab), figure) for lab in labels]
            if any(f is None for f in flags):
                unread.append(name)
                continue
            decided.append(name)
            if t in HARMFUL and not any(flags):
                false_stable.append(name)
            if t == "benign" and any(flags):
                false_unstable.append(name)
        out[group] = {"decided": decided, "false_stable": false_stable, "false_unstable": false_unstable,
                      "unread": unread}
    return out


def could_not_see(truth: dict, readings: dict, cases: dict[str, Case], labels: list[str], census_by: dict) -> list[str]:
    """A line for each case the truth calls damaging or non-finite that the reading called stable at every state,
    and for each tiny-moment block in a state's census the reading has no unit for."""
    lines = []
    for level in ("at_limit", "at_tolerance"):
        for name, case in cases.items():
            t = truth["cases"].get(case.truth or "", {})
            if t.get(level) not in HARMFUL:
                continue
            cells = [readings[name].get(lab) for lab in labels]
            if any(unstable(c) is None for c in cells) or any(unstable(c) for c in cells):
                continue
            values = ", ".join(f"{lab}: {c['main']['value']:.3g}" for lab, c in zip(labels, cells))
            gap = t.get("gap_pct", math.nan)
            lines.append(f"{level}: {name} (truth {t[level]}" + (f", gap {gap:+.2f}%" if math.isfinite(gap) else "")
                         + ") read stable at "
                         f"every state ({values}; limit {cells[0]['main']['limit']:g})")
    pre_fix = [n for n, c in cases.items() if c.pre_fix and any(line.startswith(f"at_limit: {n} ") for line in lines)]
    lines += [f"{n}: the reading applies the policy's storage once to the BF16 run's FP32 moments; the zero codes a "
              "starved fp8_block block accumulates in that policy's own run (where 0 * inf made the NaN) are not in "
              "them, so a late state shows the NaN only where a unit's block is already below 1.3e-36 with exact "
              "zeros (the census; the planted starved state)" for n in pre_fix]
    for step, found in census_by.items():
        for param, c in found.items():
            if not c["unit"] and c["blocks_overflow"]:
                lines.append(f"state at step {step}: {param} holds {c['blocks_overflow']} first-moment blocks below "
                             f"1.3e-36 (the pre-fix NaN's), smallest {c['smallest_amax']:.3g}: not a precision unit, "
                             "so no reading's update covers it")
    return lines


# ---- the report ----------------------------------------------------------------------------------------------


def _cell(cell: dict | None) -> str:
    if not cell:
        return "-"
    if "error" in cell:
        return "error"
    c = cell["main"]
    if c["call"] == "non-finite":
        return "NON-FINITE"
    return f"{c['value']:.3g}" + ("*" if c["call"] == "unstable" else "")


def table(report: dict) -> str:
    labels = list(report["states"])
    t = report["truth"]
    lines = [f"truth: {t['source']} ({t.get('device')}, {t.get('date')}); detection limit "
             f"{t['detection_limit_pct']:.2f}%, tolerance {t['tolerance_pct']}%",
             f"reading: {report['meta']['measure']} at each state of one {report['meta']['setup']['steps']}-step BF16 "
             f"run (limit {DEFAULT_LIMITS[report['meta']['measure']]:g}; * unstable)",
             "| case | truth at the limit | at 0.25% | gap % ± SE | " + " | ".join(labels) + " |",
             "|---|---|---|---|" + "---|" * len(labels)]
    for name, cells in report["readings"].items():
        tr = t["cases"].get(report["cases"][name]["truth"] or "", {})
        gap = (f"{tr['gap_pct']:+.2f} ± {tr['se_pct']:.2f}" if math.isfinite(tr.get("gap_pct", math.nan))
               else "—")
        lines.append(f"| {name} | {tr.get('at_limit', 'graded (no truth)')} | {tr.get('at_tolerance', '')} | {gap} | "
                     + " | ".join(_cell(cells.get(lab)) for lab in labels) + " |")
    for level, groups in report["judge"].items():
        for group, j in groups.items():
            lines.append(f"{level}, {group} states: {len(j['decided'])} decided, false-stable {len(j['false_stable'])}"
                         + (f" ({', '.join(j['false_stable'])})" if j["false_stable"] else "")
                         + f", false-unstable {len(j['false_unstable'])}"
                         + (f" ({', '.join(j['false_unstable'])})" if j["false_unstable"] else "")
                         + (f", unread {', '.join(j['unread'])}" if j["unread"] else ""))
    for figure, groups in report["judge_by_figure"].items():
        j = groups["all"]
        lines.append(f"  by {figure} (limit {DEFAULT_LIMITS[figure]:g}), all states, at the limit: false-stable "
                     f"{len(j['false_stable'])}, false-unstable {len(j['false_unstable'])}")
    lines.append("could not see:" + ("" if report["could_not_see"] else " nothing"))
    lines += [f"  {line}" for line in report["could_not_see"]]
    lines.append(f"truth's detection limit: {t['detection_limit_pct']:.2f}% (a gap below it is not decided)")
    if report["starved"]:
        st = report["starved"]
        lines.append(f"planted starved state (step {st['step']}, {st['unit']} first block decayed {st['steps']} "
                     "steps): "
                     + "; ".join(f"{n}: {_cell(c)}" for n, c in st["readings"].items()))
    for label, st in report["states"].items():
        tiny = {n: c for n, c in st["census"].items() if c["blocks_overflow"] or c["blocks_below_min_amax"]}
        lines.append(f"census {label}: " + ("no first-moment block below MIN_AMAX" if not tiny else "; ".join(
            f"{n}{' (unit)' if c['unit'] else ''}: {c['blocks_overflow']} blocks < 1.3e-36, "
            f"{c['blocks_below_min_amax']} < MIN_AMAX, smallest {c['smallest_amax']:.3g}" for n, c in tiny.items())))
    lay = report["layout"]
    if lay:
        lines.append(f"layout check at step {lay['step']}: trained model {lay['trained_model_loss']:.4f}, Llama at the "
                     f"kept state {lay['llama_at_state_loss']:.4f} ({100 * lay['relative_difference']:+.2f}%)"
                     + (f"; MISMATCH over {100 * LAYOUT_TOLERANCE:g}%: the readings are not at the run's states"
                        if abs(lay["relative_difference"]) > LAYOUT_TOLERANCE else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--truth", type=Path, default=TRUTH, help="the soak's report JSON, or its run cache (.jsonl)")
    ap.add_argument("--truth-steps", type=int, default=soak.Setup.steps, help="the cached soak runs' steps (.jsonl)")
    ap.add_argument("--steps", type=int, help="the long BF16 run's steps (default: the soak's, 2000; smoke 200)")
    ap.add_argument("--probe-step", type=int, help="the probe's state (default 50; smoke 10)")
    ap.add_argument("--states", type=float, nargs="+", default=[0.25, 0.5, 0.75, 0.95],
                    help="late states, fractions of --steps (the decay starts at 0.75)")
    ap.add_argument("--batches", type=int, help="batches per state of the reading (default 8; smoke 4)")
    ap.add_argument("--measure", default="update_norm", choices=list(MEASURES))
    ap.add_argument("--planted-bits", type=int, nargs="*", default=[0, 1, 2, 3])
    ap.add_argument("--starve-steps", type=int, default=800, help="the planted starved state's steps without a "
                    "gradient (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="CPU: the soak's toy Llama, emulated FP8, < 2 minutes")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    began = time.perf_counter()
    steps = args.steps or (200 if args.smoke else soak.Setup.steps)
    probe_step = args.probe_step or (10 if args.smoke else 50)
    args.batches = args.batches or (4 if args.smoke else 8)
    s = soak.setup(steps, args.smoke)
    if steps < soak.CHECK_EVERY or not 0 < probe_step < steps or not all(0 < f < 1 for f in args.states):
        ap.error("need --steps >= 50, 0 < --probe-step < --steps, --states in (0, 1)")
    if args.smoke:
        device, bench_backend = torch.device("cpu"), "emulated"
    elif not torch.cuda.is_available():
        raise SystemExit("bench_judge_soak runs on a GPU; use --smoke on CPU")
    else:
        device, bench_backend = torch.device("cuda"), "te"
    args.out.mkdir(parents=True, exist_ok=True)
    truth = soak_truth(args.truth, args.truth_steps)
    cfg = soak.model_config(s)
    if not args.smoke:  # bench_stack.Reference's rotary embedding is TE's, without Llama 3.1's frequency scaling
        cfg = replace(cfg, rope_scaling=None)
    late = {f"{round(100 * f)}%": round(f * steps) for f in args.states}
    at = {f"probe ({probe_step})": probe_step} | {f"{k} ({v})": v for k, v in late.items()}
    keeper = Keeper(s, cfg, [0, *at.values()], min(late.values()), device,
                    planted_damage.backend(bench_backend, device), args.seed)
    print(f"BF16 run: {steps} steps, states at {list(at.values())}", file=sys.stderr, flush=True)
    run = soak.train(soak.BASE, args.seed, s, on_state=keeper)
    run_s = time.perf_counter() - began
    print(f"  {soak._describe(run)}; layout {keeper.layout}", file=sys.stderr, flush=True)
    by_step = {st.step: st for st in keeper.states}
    states = {label: by_step[step] for label, step in at.items()}
    cases = judge_cases(args.planted_bits)
    readings = read_all(cases, states, s, cfg, device, bench_backend, args.batches, args.measure)
    groups = {"probe": [next(iter(at))], "late": list(at)[1:], "all": list(at)}
    starved_report = None
    if args.starve_steps:
        unit = unit_names(cfg)[0]
        last = states[list(at)[-1]]
        pair = {n: cases[n] for n in (PRE_FIX, "std_fp32_fp8block")}
        got = read_all(pair, {"starved": starved(last, unit, args.starve_steps)}, s, cfg, device, bench_backend,
                       args.batches, args.measure)
        starved_report = {"step": last.step, "unit": unit, "steps": args.starve_steps,
                          "readings": {n: got[n]["starved"] for n in pair}}
    report = {
        "meta": {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name() if
                 device.type == "cuda" else "cpu", "torch": torch.__version__, "backend": bench_backend,
                 "setup": asdict(s), "seed": args.seed, "measure": args.measure, "batches": args.batches,
                 "limits": DEFAULT_LIMITS, "bf16_run": run, "bf16_run_s": run_s,
                 "wall_s": time.perf_counter() - began, "pre_fix_min_amax": PRE_FIX_MIN_AMAX,
                 "min_amax": fp8_state_adam.MIN_AMAX},
        "truth": truth,
        "states": {label: {"step": st.step, "lr": st.lr, "census": keeper.census[st.step]}
                   for label, st in states.items()},
        "cases": {n: {"truth": c.truth, "backend": c.backend or bench_backend, "pre_fix": c.pre_fix,
                      "policy": c.policy.to_dict()} for n, c in cases.items()},
        "readings": readings,
        "judge": {level: judge(truth, readings, cases, groups, level) for level in ("at_limit", "at_tolerance")},
        "judge_by_figure": {m: judge(truth, readings, cases, groups, "at_limit", m) for m in MEASURES},
        "could_not_see": could_not_see(truth, readings, cases, list(at),
                                       {st.step: keeper.census[st.step] for st in states.values()}),
        "starved": starved_report,
        "layout": keeper.layout,
    }
    report["meta"]["wall_s"] = time.perf_counter() - began
    print(table(report))
    path = args.out / f"{report['meta']['date']}_bench_judge_soak{'_smoke' if args.smoke else ''}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path} ({report['meta']['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
