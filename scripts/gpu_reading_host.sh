#!/usr/bin/env bash
# Issue 29: the fixed-state reading with its states in host memory (objectives.damage.keep_states: host, as on an
# 80 GB H100 at the shipped 8B space), the code before (.before: its package) and this checkout's, one after the
# other on one card, TRIALS (default 2) trials each, each with its run's trace and its own empty compile caches.
# The trace's "reading: side" spans are the state's weights set into the kept model (the copy that converted on
# the CPU before 2026-12-05), "reading: compare" the state's copy in and the figures.
#   run(command="bash scripts/gpu_reading_host.sh", carry=[".gpu", ".before"], timeout_s=...)
# Ran on an H100 on 2026-12-06 (docs/throughput.md, "A longer study, and the reading fix, on an H100").
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_reading_host_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 - <<'PY'
import yaml
space = yaml.safe_load(open("search_spaces/llama3_8b_h100.yaml"))
space["objectives"]["damage"]["keep_states"] = "host"
yaml.safe_dump(space, open("/tmp/space_host.yaml", "w"), sort_keys=False)
PY
for variant in before after; do
  code="$PWD"; [ "$variant" = before ] && code="$PWD/.before"
  rm -rf "/tmp/reading_host_$variant" "/tmp/caches_$variant"
  # run from the code's own tree: `python -m` imports the package in the current directory first
  (cd "$code" && PRECSEARCH_TRACE="$OUT/trace_$variant.jsonl" TORCHINDUCTOR_CACHE_DIR="/tmp/caches_$variant/inductor" \
    TRITON_CACHE_DIR="/tmp/caches_$variant/triton" timeout "${TIMEOUT:-110}" python3 -m precsearch run \
    /tmp/space_host.yaml --n-trials "${TRIALS:-2}" --output-dir "/tmp/reading_host_$variant" --no-progress \
    > "$OUT/run_$variant.log" 2>&1)
  echo "$variant: precsearch run exit $?" | tee -a "$OUT/run_$variant.log"
  python3 -m precsearch.runtime.timeline "$OUT/trace_$variant.jsonl" | head -12
done
