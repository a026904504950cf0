"""What a Llama block saves for its backward: BF16 vs torchao FP8, eager vs ``torch.compile``.

    python benchmarks/torchao_saved.py [--layers 2] [--json OUT.json]    # a CUDA GPU (torchao, transformers)
    python benchmarks/torchao_saved.py --model torchtitan                # torchtitan's Llama 3 and converter
    python benchmarks/torchao_saved.py --param-dtype bf16                # HF blocks with BF16 parameters (not run yet)

``--model hf`` (the default) converts a Hugging Face ``LlamaForCausalLM`` with torchao's
``convert_to_float8_training`` and compiles each block; ``--model torchtitan`` builds torchtitan's own run
from precsearch's export of each of ``--policies`` (:mod:`frameworks_torchtitan`: its converter and its
per-block compile), so a policy with FP8 attention and BF16 MLPs shows what each kind of layer saves.

For issue 30's torchao memory rows: at the 8B width (seq 4096, FP32 parameters under BF16 autocast, as the
framework bench trains them) each variant runs one warm-up step, then one measured forward and backward.
It prints the bytes alive after the forward (everything saved for the backward, plus the loss) above the
bytes before it, the backward's peak above the same base, and the tensors the autograd graph saved,
grouped by dtype and shape (``torch.autograd.graph.saved_tensors_hooks``, one count per storage; a compiled
block's saved tensors are its AOTAutograd graph's). The vocabulary is small so that the loss does not hide
the blocks. The list skips Parameters but not views of them: torchao saves ``weight.t()``, so its eager FP8
list shows the FP32 weights (224 MiB each at this width) that hold no memory of their own, and its "saved"
total exceeds "after fwd"; the two memory columns are the measurement. The memory model's rule is in ``precsearch/probe/memory/peak.py`` (``FP8_LINEARS``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 2**30
VOCAB = 1024  # small, so that the loss does not hide the blocks
#: --model torchtitan: the bench's policies whose blocks tell apart what each kind of layer saves (the mixed
#: policy runs FP8 attention and BF16 MLPs there: torchtitan has no delayed scaling).
TITAN_POLICIES = ("bf16", "fp8_current", "attn_current+mlp_delayed")


def build(layers: int, fp8: bool, compiled: bool, param_dtype: str = "fp32"):
    """A Hugging Face model (``param_dtype`` ``bf16``: cast to BF16, as Accelerate's export says to load it for
    a master-weights policy); its loss for input ids (labels the same ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=VOCAB, max_position_embeddings=8192, rope_theta=500000.0,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    if param_dtype == "bf16":
        model = model.to(torch.bfloat16)
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda m, fqn: fqn.startswith("model.layers."))
    if compiled:
        for i, block in enumerate(model.model.layers):
            model.model.layers[i] = torch.compile(block)

    def loss_of(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(input_ids=ids, labels=ids).loss

    return model, loss_of


def build_torchtitan(layers: int, policy: str, compiled: bool, seq: int):
    """torchtitan's run of precsearch's export of the bench's ``policy``; its loss for input ids."""
    import tempfile

    import frameworks_plan as plan
    import frameworks_torchtitan as titan
    import torch

    shape = plan.Shape(layers=layers, vocab=VOCAB, seq=seq)
    files, _ = plan.export_files("torchtitan", plan.policy_named(policy, layers), layers, Path(tempfile.mkdtemp()))
    torch.manual_seed(0)
    run = titan.build(files[plan.TITAN_FILE], shape, "cuda", lr=1e-4, weight_decay=0.1, compile_model=compiled)
    return run.model, lambda ids: run.forward(ids, ids)


def measure(layers: int, fp8: bool, compiled: bool, seq: int, policy: str | None = None,
            param_dtype: str = "fp32") -> dict:
    """One variant: ``policy`` (a bench policy name) builds torchtitan's run of its export, else ``fp8`` a
    Hugging Face model with or without torchao's conversion."""
    import torch

    model, loss_of = (build(layers, fp8, compiled, param_dtype) if policy is None
                      else build_torchtitan(layers, policy, compiled, seq))
    ids = torch.randint(0, VOCAB, (1, seq), device="cuda")

    def step(record=None):
        if record is None:
            return loss_of(ids)
        with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
            return loss_of(ids)

    step().backward()  # warm-up: compile, lazy state
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    seen: dict[int, tuple[str, tuple[int, ...], int]] = {}

    def record(t):
        if t.device.type == "cuda" and not isinstance(t, torch.nn.Parameter):
            key = t.untyped_storage().data_ptr()
            seen.setdefault(key, (str(t.dtype).removeprefix("torch."), tuple(t.shape), t.untyped_storage().nbytes()))
        return t

    loss = step()
    torch.cuda.synchronize()
    after_forward = torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    backward_peak = torch.cuda.max_memory_allocated() - base
    del loss
    model.zero_grad(set_to_none=True)
    hooks_error = None
    try:  # a separate step: hooks may make torch.compile recompile, so they stay out of the measured one
        step(record).backward()
    except Exception as exc:  # noqa: BLE001 - the memory figures stand without the list
        hooks_error = f"{type(exc).__name__}: {exc}"[:200]
    groups = Counter()
    sizes = {}
    for dtype, shape, nbytes in seen.values():
        groups[(dtype, shape)] += 1
        sizes[(dtype, shape)] = nbytes
    saved = sorted(((d, s, n, sizes[(d, s)]) for (d, s), n in groups.items()), key=lambda r: -r[2] * r[3])
    return {"fp8": fp8, "policy": policy, "compiled": compiled, "param_dtype": param_dtype,
            "after_forward_gib": after_forward / GIB,
            "hooks_error": hooks_error,
            "backward_peak_gib": backward_peak / GIB,
            "saved_gib": sum(n * b for _, _, n, b in saved) / GIB,
            "saved": [{"dtype": d, "shape": list(s), "count": n, "mib_each": b / 2**20} for d, s, n, b in saved]}


def _release() -> None:
    """Give back the previous variant's model before the next one is built."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--model", choices=("hf", "torchtitan"), default="hf")
    ap.add_argument("--policies", nargs="+", default=list(TITAN_POLICIES), help="--model torchtitan: bench policies")
    ap.add_argument("--param-dtype", choices=("fp32", "bf16"), default="fp32",
                    help="--model hf: the parameters' dtype (autocast is BF16 either way)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.model == "torchtitan" and args.param_dtype != "fp32":
        ap.error("--param-dtype is for --model hf (torchtitan's run keeps FP32 parameters)")
    variants = ([(p != "bf16", p) for p in args.policies] if args.model == "torchtitan"
                else [(fp8, None) for fp8 in (False, True)])
    rows = []
    for compiled in (False, True):
        for fp8, policy in variants:
            try:
                rows.append(measure(args.layers, fp8, compiled, args.seq, policy, args.param_dtype))
                _release()
            except Exception as exc:  # noqa: BLE001 - a variant that fails is a row that says so
                rows.append({"fp8": fp8, "policy": policy, "compiled": compiled,
                             "error": f"{type(exc).__name__}: {exc}"[:300]})
    print(f"{args.model}: {args.layers} blocks at the 8B width, seq {args.seq}, {args.param_dtype.upper()} params "
          "under BF16 autocast; "
          "GiB above the bytes before the forward")
    print(f"{'variant':34s} {'after fwd':>9} {'bwd peak':>9} {'saved':>7}")
    for r in rows:
        name = f"{'compiled' if r['compiled'] else 'eager'} {r['policy'] or ('fp8' if r['fp8'] else 'bf16')}"
        if "error" in r:
            print(f"{name:34s} {r['error']}")
            continue
        print(f"{name:34s} {r['after_forward_gib']:9.3f} {r['backward_peak_gib']:9.3f} {r['saved_gib']:7.3f}"
              f"{'  saved list: ' + r['hooks_error'] if r['hooks_error'] else ''}")
        for s in r["saved"]:  # every entry: the 12 largest alone hid where the final norm's tensors were
            print(f"    {s['count']:3d} x {s['dtype']:14s} {str(tuple(s['shape'])):24s} {s['mib_each']:8.1f} MiB")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "layers": args.layers, "seq": args.seq, "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
