"""Peak memory of the fixed-state reading (issue 55: "<= 3 x the model's BF16 size plus its batches").

A Llama of a chosen shape (random init, precsearch's own builder; default SmolLM2-135M's width 576, 9/3 heads,
FFN 1536, vocab 49152, but 4 of its 30 blocks) on synthetic tokens, read the way a study reads it: a
:class:`~precsearch.probe.damage.DamageReader` made as ``ProbeHost.damage_reader`` makes it, whose
``bf16_sides`` (the BF16 run to its states and the BF16 side there) the first ``read`` of a clipping value pays.

Each measurement runs in a fresh subprocess (``--child``), so no earlier allocation hides its peak:

* ``bf16``: the BF16 side alone (``reader.bf16_sides(clip)``);
* ``policy``: the BF16 side, then one FP8 policy's reading (``reader.read(policy)``), its peak taken after
  the high-water mark is reset (``/proc/self/clear_refs``), so it counts what the BF16 side holds between
  trials plus the policy's own part.

On a CPU the peak is the process's resident-set high-water mark (``VmHWM``; ``ru_maxrss`` where it cannot be
reset) minus the RSS after the data and torch's first optimizer were made (``base``); on CUDA
``torch.cuda.max_memory_allocated`` minus what was allocated then. Each peak is given in bytes, in bytes per
model parameter, and as a ratio to the target: 3 x the model's BF16 size (2 bytes a parameter) plus the token
batches a reading holds (its gradient batches, delayed scaling's warm batches and the held-out set, int64
inputs and targets). Prints a table; writes JSON under ``--out``.

``--keep-states`` picks where the reader keeps the BF16 run's states (``objectives.damage.keep_states``; ``auto``
is ``disk`` on a CPU where the temporary directory has room and they would hold over 256 MiB in memory). On
disk (``--spill-dir``, default the temporary directory) the states and gradients are in anonymous files: the page cache that buffers them is the kernel's,
not the process's resident set; each row gives the bytes the reader keeps in memory (``reader_host_bytes``) and
on disk (``reader_disk_bytes``) after the BF16 side.

    OMP_NUM_THREADS=1 python benchmarks/bench_reading_memory.py --out /tmp/rm               # CPU, a few minutes
    OMP_NUM_THREADS=1 python benchmarks/bench_reading_memory.py --keep-states host --out /tmp/rm   # states in memory
    OMP_NUM_THREADS=1 python benchmarks/bench_reading_memory.py --layers 2 --dim 64 --vocab 512 --ffn-dim 128 \\
        --heads 4 --kv-heads 2 --out /tmp/rm                                              # seconds
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's precsearch (a worktree's too)

from precsearch.arch.config import ModelConfig  # noqa: E402
from precsearch.backends import get_backend  # noqa: E402
from precsearch.config.space import DamageSection, ProbeSection  # noqa: E402
from precsearch.policy import Policy, Rule  # noqa: E402
from precsearch.precision import Precision  # noqa: E402
from precsearch.probe.damage import DamageReader  # noqa: E402
from precsearch.probe.data import TokenBatches, synthetic_tokens  # noqa: E402
from precsearch.probe.model.llama3 import Llama3  # noqa: E402

PARTS = ("bf16", "policy")


def model_config(args) -> ModelConfig:
    return ModelConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_dim=args.ffn_dim, max_seq_len=max(args.seq_len, 64))


def n_params(cfg: ModelConfig) -> int:
    """The probe model's parameters (built on the meta device: no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in Llama3(cfg).parameters())


def batch_bytes(micro_batch: int, seq_len: int, settings: DamageSection, eval_batches: int) -> int:
    """The token batches a reading holds: gradient batches, warm batches, held-out set (inputs and targets,
    int64)."""
    return (settings.batches + settings.warm_batches + eval_batches) * 2 * micro_batch * seq_len * 8


def fp8_policy(clip: float | None, name: str) -> Policy:
    """One FP8 recipe on every unit (blocks and output layer)."""
    return Policy(rules=(Rule("fp8", ("*",), Precision(name)),), clip_grad=clip)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status(field: str) -> int | None:
    """``field`` of /proc/self/status (``VmHWM``, ``RssAnon``, ``RssFile``) in bytes, or None where /proc has none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _hwm() -> int | None:
    """The resident-set high-water mark (``VmHWM``) in bytes, or None where /proc has none."""
    return _status("VmHWM")


def _rss_split() -> dict[str, int | None]:
    """The resident set by kind: anonymous memory (the heap, tensors) and file pages (the libraries' code)."""
    return {"anon": _status("RssAnon"), "file": _status("RssFile")}


def _reset_hwm() -> bool:
    """Reset the resident-set high-water mark (Linux ``clear_refs`` 5); False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Meter:
    """Memory in use and its peak since :meth:`reset`: RSS / its high-water mark on a CPU, allocated / max
    allocated on CUDA."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kind = "cuda max_memory_allocated" if device.type == "cuda" else "CPU resident set (VmHWM)"

    def now(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.memory_allocated(self.device)
        return _rss()

    def reset(self) -> bool:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return True
        if _reset_hwm():
            return True
        self.kind = "CPU ru_maxrss (process lifetime: not reset)"
        return False

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        hwm = _hwm() if "VmHWM" in self.kind else None
        return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(args) -> dict:
    """One measurement (``args.child``: ``bf16`` or ``policy``) in this process."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = model_config(args)
    probe = ProbeSection(steps=args.steps, micro_batch=args.micro_batch, seq_len=args.seq_len, lr=args.lr,
                         lr_warmup_steps=1, device=args.device, seed=0)
    settings = DamageSection(states=args.states, batches=args.batches, tokens_per_step=4_194_304,
                             keep_states=args.keep_states, compile_compare=False)
    tokens = synthetic_tokens(args.tokens, cfg.vocab_size, seed=0)
    data = TokenBatches(tokens, seq_len=args.seq_len, micro_batch=args.micro_batch, seed=0,
                        eval_batches=args.eval_batches)
    backend = get_backend("emulated", device)
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # torch's first optimizer imports dynamo (as ProbeHost)
    meter = Meter(device)
    gc.collect()
    base = meter.now()
    split = _rss_split()
    reader = DamageReader(cfg, probe, data, backend, device, settings, spill_dir=args.spill_dir)
    out: dict = {"part": args.child, "base_bytes": base, "meter": meter.kind}
    reset = meter.reset()
    t0 = time.perf_counter()
    reader.bf16_sides(args.clip)
    out["bf16_side_s"] = time.perf_counter() - t0
    out["bf16_peak_bytes"] = meter.peak() - base
    gc.collect()
    out["bf16_held_bytes"] = meter.now() - base
    if device.type == "cpu":  # what the held bytes are: anonymous memory, or file pages the run first touched
        out["bf16_held_split_bytes"] = {k: (v - split[k] if v is not None and split[k] is not None else None)
                                        for k, v in _rss_split().items()}
    out["states_on"] = reader.states_on.get(args.clip)
    out["reader_host_bytes"], out["reader_disk_bytes"] = reader.host_bytes(), reader.disk_bytes()
    if args.child == "policy":
        reset = meter.reset() and reset
        before = meter.now() - base
        t0 = time.perf_counter()
        reading = reader.read(fp8_policy(args.clip, args.policy))
        out["policy_s"] = time.perf_counter() - t0
        out["policy_peak_bytes"] = meter.peak() - base
        out["policy_own_peak_bytes"] = out["policy_peak_bytes"] - before
        out["reading"] = {"value": reading["value"], "se": reading["se"], "states": reading["states"]}
    out["peak_reset"] = reset
    reader.close()
    return out


def run_child(argv: list[str], part: str) -> dict:
    """``part`` measured in a fresh interpreter (its peak unhidden by anything this process allocated)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.json"
        env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run([sys.executable, __file__, *argv, "--child", part, "--child-json", str(path)], check=True,
                       env=env)
        return json.loads(path.read_text())


def predicted(cfg: ModelConfig, args, settings: DamageSection, params: int) -> dict[str, int]:
    """What the reading holds by kind, from the sizes alone: the states (every weight and each unit's two moments
    in FP32), the BF16 side's kept gradients (:func:`~precsearch.probe.damage.placement.gradient_bytes`), and at
    one state of a policy's reading its model (FP32 weights) and its gradients (FP32, each batch's)."""
    from precsearch.probe.damage.placement import gradient_bytes, state_bytes, unit_elements

    n_states = len(settings.state_steps(args.steps))
    probe = ProbeSection(steps=args.steps, micro_batch=args.micro_batch, seq_len=args.seq_len, device=args.device)
    return {"states": state_bytes(cfg, n_states), "BF16 side's gradients": gradient_bytes(cfg, probe, settings,
                                                                                          n_states),
            "policy model (one state)": 4 * params,
            "policy gradients (one state)": 4 * settings.batches * unit_elements(cfg)}


def table(rows: list[dict], params: int, target: int) -> str:
    head = f"{'what':34s} {'MiB':>9} {'B/param':>8} {'x target':>9}"
    lines = [head]

    def line(name: str, b: int) -> None:
        lines.append(f"{name:34s} {b / 2**20:9.1f} {b / params:8.2f} {b / target:9.2f}")

    for r in rows:
        if r["part"] == "bf16":
            line("BF16 side: peak", r["bf16_peak_bytes"])
            line("BF16 side: held after", r["bf16_held_bytes"])
        else:
            line(f"policy reading: peak (BF16 side held)", r["policy_peak_bytes"])
            line("policy reading: own part", r["policy_own_peak_bytes"])
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=576)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--ffn-dim", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4, help="the BF16 run's steps (its states: --states of them)")
    ap.add_argument("--states", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--eval-batches", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--policy", default="fp8_current", help="the FP8 precision of the policy read (every unit)")
    ap.add_argument("--keep-states", default="auto", choices=["auto", "host", "device", "disk"],
                    help="objectives.damage.keep_states (auto: disk on a CPU where the temporary directory has "
                         "room and the states are over 256 MiB)")
    ap.add_argument("--spill-dir", type=Path, default=None,
                    help="where keep_states disk writes its (anonymous) files; default: the temporary directory")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--label", default="", help="a tag in the JSON's name (e.g. before / after)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    ap.add_argument("--child-json", type=Path, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.child:
        args.child_json.write_text(json.dumps(child(args)))
        return 0
    cfg = model_config(args)
    params = n_params(cfg)
    settings = DamageSection(states=args.states, batches=args.batches)
    model_bf16, batches = 2 * params, batch_bytes(args.micro_batch, args.seq_len, settings, args.eval_batches)
    target = 3 * model_bf16 + batches
    rows = [run_child(argv, part) for part in args.parts]
    parts = predicted(cfg, args, settings, params)
    text = table(rows, params, target) + "\n" + "\n".join(
        f"{'  predicted: ' + name:34s} {b / 2**20:9.1f} {b / params:8.2f} {b / target:9.2f}" for name, b in parts.items())
    print(f"model: {args.layers} blocks, width {args.dim}, vocab {args.vocab}: {params / 1e6:.2f}M parameters, "
          f"BF16 {model_bf16 / 2**20:.1f} MiB; batches {batches / 2**20:.2f} MiB; target {target / 2**20:.1f} MiB "
          f"(3 x BF16 + batches); meter: {rows[0]['meter']}; states on {rows[0]['states_on']}")
    print(text)
    load = os.getloadavg()
    result = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "torch": torch.__version__, "device": args.device, "load_avg": load,
                       "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                if not k.startswith("child")},
                       "params": params, "model_bf16_bytes": model_bf16, "batch_bytes": batches,
                       "target_bytes": target, "predicted_bytes": parts},
              "rows": rows, "table": text}
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"_{args.label}" if args.label else ""
    path = args.out / f"{datetime.date.today().isoformat()}_{args.device}_bench_reading_memory{tag}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
