#!/usr/bin/env bash
# Issue 8 on a several-GPU machine: one study on 1 GPU, then on all GPUs (one worker each), side by side.
#   run(command="bash scripts/gpu_parallel.sh 8", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=600)
# Argument: trials per configuration (default 8). Results: $OUT/bench_parallel.{json,log}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_parallel_out}"
SITE="${SITE:-/tmp/site}"
mkdir -p "$OUT" "$SITE"
[ -d "$SITE/transformer_engine" ] || tar xJf .gpu/site.tar.xz -C "$SITE" || exit 2
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv
python3 scripts/bench_parallel.py search_spaces/llama3_8b_h100.yaml --n-trials "${1:-8}" --gpus 0 all \
    --out /tmp/bench_parallel 2>&1 | grep -v "INFO mlflow" | tee "$OUT/bench_parallel.log"
status=${PIPESTATUS[0]}
cp /tmp/bench_parallel/bench_parallel.json "$OUT/" 2>/dev/null
exit "$status"
