#!/usr/bin/env bash
# One study on 1 GPU, then on 2, 4 and 8 GPUs (one worker each, as many as the machine has), side by side:
# trials per hour, steady trials per hour after start-up, and per-GPU efficiency against one GPU.
#   run(command="bash scripts/gpu_parallel.sh 8", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=600)
#   run(command="bash scripts/gpu_parallel.sh 16", kind="nvidia-h200-x8", carry=[".gpu"], timeout_s=600)
# Argument: trials per configuration (default 8). CONFIGS overrides the --gpus configurations
# (default: 0, then 0,1 / 0..3 / 0..7 up to the GPUs present). Results: $OUT/bench_parallel.{json,log}.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_parallel_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=index,name,memory.total --format=csv
gpus=$(nvidia-smi -L | wc -l)
configs="0"
for n in 2 4 8; do
    [ "$n" -le "$gpus" ] && configs="$configs $(seq -s, 0 $((n - 1)))"
done
python3 scripts/bench_parallel.py search_spaces/llama3_8b_h100.yaml --n-trials "${1:-8}" --gpus ${CONFIGS:-$configs} \
    --out /tmp/bench_parallel 2>&1 | grep -v "INFO mlflow" | tee "$OUT/bench_parallel.log"
status=${PIPESTATUS[0]}
cp /tmp/bench_parallel/bench_parallel.json "$OUT/" 2>/dev/null
exit "$status"
