#!/usr/bin/env bash
# Issue 21's "show that it matters" on one H200: pretrain a small Llama 3 in BF16, save it as a Hugging Face
# checkpoint on the device's /tmp, then short probes of fixed policies from random init vs from that checkpoint,
# and longer runs from the checkpoint as the truth (scripts/gpu_checkpoint_compare.py). About 6-7 minutes:
#   run(command="bash scripts/gpu_checkpoint_compare.sh", carry=[".gpu"], timeout_s=450)
# CC_PICK (first|last|spread) and CC_PROBE_LAYERS (default 4 of 8) choose the short probes' blocks.
# CC_DEADLINE (s, default 370): no run starts that would end after it; the JSON is rewritten after every run.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_checkpoint_compare_out
source "$(dirname "$0")/gpu_env.sh"
gpu_util_log "$OUT/gpu_util.log" 30
SMI=$!
python3 scripts/gpu_checkpoint_compare.py --deadline-s "${CC_DEADLINE:-370}" --pick "${CC_PICK:-spread}" \
    ${CC_PROBE_LAYERS:+--probe-layers $CC_PROBE_LAYERS} \
    --checkpoint /tmp/precsearch_ckpt --json "$OUT/checkpoint_compare.json" > "$OUT/checkpoint_compare.log" 2>&1
echo "gpu_checkpoint_compare exit $?" >> "$OUT/checkpoint_compare.log"
kill "$SMI"
ls -la /tmp/precsearch_ckpt >> "$OUT/checkpoint_compare.log"
tail -40 "$OUT/checkpoint_compare.log"
