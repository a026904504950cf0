#!/usr/bin/env bash
# Issue 30, H200 calls 5 and 6 (2026-12-03): the rows whose code changed since the second run, each with
# the new training check: Accelerate's torchao snippet (enable_fsdp_float8_all_gather=False, BF16 cast for
# the knobs), torchtitan's compiled blocks (the _orig_mod name strip), the probe's fused-MLP module check;
# then what compiled and eager HF blocks save for the backward (scripts/torchao_saved.py).
#   run(command="bash scripts/gpu_frameworks_torchao.sh", carry=[".gpu"], timeout_s=600)           # ~6 min
#   run(command="PART=rest bash scripts/gpu_frameworks_torchao.sh", carry=[".gpu"], timeout_s=600) # ~5 min
# PART=rest re-runs what call 5 could not finish: the Accelerate knob row (with its resident memory by
# part), torchtitan's bf16_edges row (its deadline), the probe rows (--frameworks did not take "probe").
# Calls 7 (per-step peaks) and 8 (the knob snippet's device_placement) ran the Accelerate knob row alone:
#   TESTS=0 NAME=call8_acc_knobs BENCH_TIMEOUT=100 BENCH_ARGS="--frameworks accelerate --policies bf16 \
#     fp8_current+bf16_moments --deadline 90 --run-timeout 40" bash scripts/gpu_frameworks.sh
set -uo pipefail
export TESTS=0
bench() {  # NAME, seconds, bench arguments
  NAME="$1" BENCH_TIMEOUT="$2" BENCH_ARGS="${*:3}" bash scripts/gpu_frameworks.sh
}
if [ "${PART:-first}" = first ]; then
  bench recheck_acc 130 --frameworks accelerate --policies bf16 fp8_current bf16_edges+fp8_current \
    fp8_current+bf16_moments --deadline 115 --run-timeout 40
  bench recheck_tt 190 --frameworks torchtitan --policies bf16 fp8_current attn_current+mlp_delayed \
    bf16_edges+fp8_current --deadline 175 --run-timeout 60
  DEFAULT_OUT=/tmp/gpu_frameworks_out
  source "$(dirname "$0")/gpu_env.sh"
  timeout 110 python3 scripts/torchao_saved.py --json "$OUT/torchao_saved.json" > "$OUT/torchao_saved.log" 2>&1
  echo "torchao_saved exit $?" >> "$OUT/torchao_saved.log"
  tail -70 "$OUT/torchao_saved.log"
else
  bench rest_acc 90 --frameworks accelerate --policies bf16 fp8_current+bf16_moments --deadline 80 --run-timeout 40
  bench rest_tt 170 --frameworks torchtitan --policies bf16 bf16_edges+fp8_current --deadline 160 --run-timeout 75
  bench rest_probe 120 --frameworks probe --policies bf16 fp8_current attn_current+mlp_delayed --deadline 110 \
    --run-timeout 40
fi
