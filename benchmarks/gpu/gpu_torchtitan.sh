#!/usr/bin/env bash
# Issue 30: the torchtitan export in torchtitan 0.2.2 itself (benchmarks/frameworks_torchtitan.py: the exported
# TOML parsed by its ConfigManager, its Llama 3, converter, per-block compile, AdamW, loss and clipping), at
# the bench's 4-block 8B-width shape, beside the probe's rows of the same policies (and of each policy as
# torchtitan runs it, "@torchtitan"); PART=saved lists what torchtitan's blocks save for the backward, eager
# and compiled (benchmarks/torchao_saved.py --model torchtitan), for the memory model's compiled rule.
#   bash benchmarks/gpu/make_framework_bundle.sh    # here: .gpu/frameworks.tar.xz and .gpu/titan_wheels/
#   run(command="bash benchmarks/gpu/gpu_torchtitan.sh", carry=[".gpu"], timeout_s=600)             # ~6 min
#   run(command="PART=saved bash benchmarks/gpu/gpu_torchtitan.sh", carry=[".gpu"], timeout_s=600)  # ~3 min
set -uo pipefail
export TESTS=0
if [ "${PART:-bench}" = bench ]; then
  NAME=torchtitan BENCH_TIMEOUT="${BENCH_TIMEOUT:-540}" BENCH_ARGS="--frameworks torchtitan probe --policies bf16 \
fp8_current attn_current+mlp_delayed bf16_edges+fp8_current mxfp8 --deadline ${DEADLINE:-520} --run-timeout 90" \
    bash benchmarks/gpu/gpu_frameworks.sh
else
  DEFAULT_OUT=/tmp/gpu_frameworks_out
  source "$(dirname "$0")/gpu_env.sh"
  gpu_frameworks_env
  timeout "${SAVED_TIMEOUT:-300}" python3 benchmarks/torchao_saved.py --model torchtitan \
    --json "$OUT/torchtitan_saved.json" > "$OUT/torchtitan_saved.log" 2>&1
  echo "torchao_saved exit $?" >> "$OUT/torchtitan_saved.log"
  tail -90 "$OUT/torchtitan_saved.log"
fi
