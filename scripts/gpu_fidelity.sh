#!/usr/bin/env bash
# Issue 14's judge on one H200: scripts/bench_fidelity.py with rungs, two seeds and the risk score.
# The runs (about 50 of 2000 steps) share the GPU, JOBS at a time, and each is saved to a cache as it
# ends; no run starts that could not end inside FID_DEADLINE seconds. The cache comes back as
# $OUT/fidelity_runs.tar.gz; carry it in .fidcache/ to the next call and the runs done are not repeated:
#   run(command="bash scripts/gpu_fidelity.sh", carry=[".gpu", ".fidcache"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_fidelity_out
source "$(dirname "$0")/gpu_env.sh"
CACHE=/tmp/fidelity_runs
mkdir -p "$CACHE"
[ -f .fidcache/fidelity_runs.tar.gz ] && tar xzf .fidcache/fidelity_runs.tar.gz -C "$CACHE"
gpu_util_log "$OUT/gpu_util.log" 30
timeout -k 10 "${FID_TIMEOUT:-560}" python3 scripts/bench_fidelity.py --rungs ${RUNGS:-50 200 2000} \
    --seeds "${SEEDS:-2}" --layers "${LAYERS:-4}" --dim "${DIM:-512}" --seq-len "${SEQ:-512}" \
    --micro-batch "${MB:-8}" --jobs "${JOBS:-8}" --deadline "${FID_DEADLINE:-500}" --cache "$CACHE" \
    ${ONLY:+--only $ONLY} --out "$OUT" > "$OUT/fidelity.log" 2>&1
echo "bench_fidelity exit $?" >> "$OUT/fidelity.log"
pkill -f bench_fidelity.py; sleep 1
tar czf "$OUT/fidelity_runs.tar.gz" -C "$CACHE" .
ls "$CACHE" | wc -l >> "$OUT/fidelity.log"
tail -45 "$OUT/fidelity.log"
