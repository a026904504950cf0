#!/usr/bin/env bash
# A short study of the B200 space (search_spaces/llama3_8b_b200.yaml: FP8 current / MXFP8 / NVFP4 per
# module, the NVFP4 switches, BF16 edge blocks) on an H200. Backend auto: Transformer Engine cannot run
# MXFP8/NVFP4 below compute capability 10.0, so the whole study runs emulated, and validate says so.
# Shortened to fit ~150 s: 2 probe blocks at the 8B width (BF16 edge: the last block only), seq 2048,
# 12 steps, 2 BF16 seeds, 4 random trials.
# Its loss gaps are emulated Blackwell numerics; its speed and memory are an emulation's, not a B200's.
#   run(command="bash scripts/gpu_b200_emulated.sh", carry=[".gpu"], timeout_s=400)
# CPU check of the script itself (tiny model, emulated, about a minute): TINY=1 bash scripts/gpu_b200_emulated.sh
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_b200_out
if [ -n "${TINY:-}" ]; then
    cd "$(dirname "$0")/.."
    OUT="${OUT:-$DEFAULT_OUT}"; mkdir -p "$OUT"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
else
    source "$(dirname "$0")/gpu_env.sh"
fi
PY="${PYTHON:-python3}"
SPACE=/tmp/b200_short.yaml
DIR="${DIR:-/tmp/b200_short_study}"
rm -rf "$DIR"
"$PY" - "$SPACE" <<'PY'
# the shipped B200 space with a shorter probe and study (TINY: a toy model on the CPU)
import os, sys, yaml
space = yaml.safe_load(open("search_spaces/llama3_8b_b200.yaml"))
space["model"]["probe_layers"] = 2
space["probe"].update(steps=12, seq_len=2048, lr=3e-4, lr_warmup_steps=4)  # lr 1e-3 with 2 warm-up steps: the BF16 reference diverged at step 4 (H200, 2026-11-30)
space["search"]["warmup_steps"] = 0
space["search"]["bf16_blocks"]["first"] = 0  # 2 blocks: BF16 at both ends would leave none low-precision
space["objectives"]["reference_seeds"] = 2
space["study"].update(name="llama3-8b-b200-short", n_trials=4, sampler="random", seed=1)
if os.environ.get("TINY"):
    space["model"] = {"preset": "tiny", "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "n_layers": 4}
    space["probe"].update(seq_len=32, micro_batch=4, device="cpu", param_dtype="fp32")
    space["study"]["n_trials"] = 2
yaml.safe_dump(space, open(sys.argv[1], "w"), sort_keys=False)
PY
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(), torch.cuda.is_available() and torch.cuda.get_device_capability())" > "$OUT/validate.txt" 2>&1
"$PY" -m precsearch validate "$SPACE" >> "$OUT/validate.txt" 2>&1
"$PY" - >> "$OUT/validate.txt" 2>&1 <<'PY'
# the emulation gives the same NVFP4 values on the GPU as on the CPU (round to nearest; RHT'd operand)
import torch
from precsearch.fp8.nvfp4 import hadamard_matrix, nvfp4_quantize, rht
dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0))
for name, fn in (("1x16", lambda t: nvfp4_quantize(t)[0]), ("16x16", lambda t: nvfp4_quantize(t, (16, 16))[0]),
                 ("rht", lambda t: nvfp4_quantize(rht(t, hadamard_matrix(device=t.device)))[0])):
    a, b = fn(x), fn(x.to(dev)).cpu()
    print(f"nvfp4 {name} cpu vs {dev}: {(a != b).sum().item()} of {a.numel()} values differ, "
          f"max |diff| {(a - b).abs().max().item():.3g}")
PY
start=$(date +%s)
timeout "${STUDY_TIMEOUT:-300}" "$PY" -m precsearch run "$SPACE" --output-dir "$DIR" --no-progress > "$OUT/study.log" 2>&1
echo "precsearch run exit $? after $(( $(date +%s) - start )) s" >> "$OUT/study.log"
"$PY" -m precsearch front --output-dir "$DIR" --all > "$OUT/front_all.txt" 2>&1
"$PY" -m precsearch export --output-dir "$DIR" --pick max-memory --format megatron --n-layers 32 -o "$OUT/megatron/" > "$OUT/export.txt" 2>&1
cat "$OUT/validate.txt"; grep -E "^trial|finished|exit" "$OUT/study.log" | tail -12; cat "$OUT/front_all.txt" "$OUT/export.txt"
ls "$OUT/megatron" 2>/dev/null && cat "$OUT/megatron/megatron_args.sh"
