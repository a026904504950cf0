#!/usr/bin/env bash
# Issue 28 on one H200, in one call: the GPU tests of the fixed-state reading, its cost and readings on the
# shipped 8B space (bench_damage_cost.py), then the judge (bench_fidelity.py --judge: 8 seeds of long runs,
# cached; no run starts that could not end inside JUDGE_DEADLINE s). The cache comes back as
# $OUT/judge_runs.tar.gz; carry it in .fidcache/ to the next call and the runs done are not repeated:
#   run(command="bash scripts/gpu_judge.sh", carry=[".gpu", ".fidcache"], timeout_s=600)
# STAGES picks the parts (default "tests cost judge"); TEST_K selects tests (pytest -k), TEST_TIMEOUT bounds them
# (s, default 150); COST_ARGS go to bench_damage_cost.py (e.g.
# "--keep-states host device"); JUDGE_DEADLINE=0 starts no training run: the readings missing from the cache
# are taken and the judge reports from the cached runs.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_judge_out
source "$(dirname "$0")/gpu_env.sh"
STAGES="${STAGES:-tests cost judge}"
gpu_util_log "$OUT/gpu_util.log" 20
if [[ " $STAGES " == *" tests "* ]]; then
    timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -s -p no:logging tests/backends/test_gpu_damage.py \
        ${TEST_K:+-k "$TEST_K"} > "$OUT/gpu_tests.log" 2>&1
    tail -40 "$OUT/gpu_tests.log"
fi
if [[ " $STAGES " == *" cost "* ]]; then
    timeout "${COST_TIMEOUT:-200}" python3 scripts/bench_damage_cost.py "${COST_SPACE:-search_spaces/llama3_8b_h100.yaml}" --out "$OUT" \
        ${COST_ARGS:-} 2>&1 | tail -15 | tee "$OUT/damage_cost.log"
fi
if [[ " $STAGES " == *" judge "* ]]; then
    CACHE=/tmp/judge_runs
    mkdir -p "$CACHE"
    [ -f .fidcache/judge_runs.tar.gz ] && tar xzf .fidcache/judge_runs.tar.gz -C "$CACHE"
    timeout -k 10 "${JUDGE_TIMEOUT:-420}" python3 scripts/bench_fidelity.py --judge --rungs ${RUNGS:-50 200 1000} \
        --seeds "${SEEDS:-8}" --layers "${LAYERS:-4}" --dim "${DIM:-512}" --seq-len "${SEQ:-512}" \
        --micro-batch "${MB:-8}" --jobs "${JOBS:-12}" --deadline "${JUDGE_DEADLINE:-360}" --cache "$CACHE" \
        --out "$OUT" > "$OUT/judge.log" 2>&1
    echo "bench_fidelity exit $?" >> "$OUT/judge.log"
    pkill -f bench_fidelity.py; sleep 1
    tar czf "$OUT/judge_runs.tar.gz" -C "$CACHE" .
    echo "cached files: $(ls "$CACHE" | wc -l)" >> "$OUT/judge.log"
    tail -60 "$OUT/judge.log"
fi
