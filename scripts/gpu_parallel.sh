#!/usr/bin/env bash
# Issue 8 on a several-GPU machine: one study on 1 GPU, then on all GPUs (one worker each), side by side.
#   run(command="bash scripts/gpu_parallel.sh 8", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=600)
# Argument: trials per configuration (default 8). Results: $OUT/bench_parallel.{json,log}.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_parallel_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=index,name,memory.total --format=csv
python3 scripts/bench_parallel.py search_spaces/llama3_8b_h100.yaml --n-trials "${1:-8}" --gpus 0 all \
    --out /tmp/bench_parallel 2>&1 | grep -v "INFO mlflow" | tee "$OUT/bench_parallel.log"
status=${PIPESTATUS[0]}
cp /tmp/bench_parallel/bench_parallel.json "$OUT/" 2>/dev/null
exit "$status"
