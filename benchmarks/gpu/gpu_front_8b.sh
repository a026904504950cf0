#!/usr/bin/env bash
# Issue 53 on one H100 or H200: the shipped 8B space's study as a user runs it, then its front and every trial,
# and (STAGES has "tests") the GPU tests of this round's changes first. Writes under $OUT: the run's log,
# front.txt (precsearch front), all.txt (front --all), front.csv/html, the export of the max-memory pick, and
# study/ (precsearch.json and optuna.db: what bench_frameworks.py --from-study reads).
#   run(command="bash benchmarks/gpu/gpu_front_8b.sh", carry=[".gpu"], timeout_s=600)
# SPACE picks another space; STAGES (default "tests study") the parts; TESTS the test files.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_front_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
STAGES="${STAGES:-tests study}"
SPACE="${SPACE:-search_spaces/llama3_8b_h100.yaml}"
if [[ " $STAGES " == *" tests "* ]]; then
    timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider \
        ${TESTS:-tests/backends/test_gpu_fp8_state_adam.py tests/backends/test_gpu_memory_knobs.py} \
        > "$OUT/gpu_tests.log" 2>&1
    echo "pytest exit $?" >> "$OUT/gpu_tests.log"
    tail -15 "$OUT/gpu_tests.log"
fi
if [[ " $STAGES " == *" study "* ]]; then
    STUDY=/tmp/front8b
    rm -rf "$STUDY"
    start=$(date +%s)
    timeout "${STUDY_TIMEOUT:-420}" python3 -m precsearch run "$SPACE" --output-dir "$STUDY" --no-progress \
        > "$OUT/study.log" 2>&1
    echo "precsearch run exit $? after $(( $(date +%s) - start )) s" >> "$OUT/study.log"
    python3 -m precsearch front --output-dir "$STUDY" > "$OUT/front.txt" 2>&1
    python3 -m precsearch front --all --output-dir "$STUDY" > "$OUT/all.txt" 2>&1
    python3 -m precsearch export --output-dir "$STUDY" --pick max-memory -o "$OUT/policy.yaml" > "$OUT/export.txt" 2>&1
    cp "$STUDY"/front/front.csv "$STUDY"/front/front.html "$OUT/" 2>/dev/null
    # the study itself, for `bench_frameworks.py --from-study` in a later call (carry it as .gpu/study)
    mkdir -p "$OUT/study" && cp "$STUDY"/precsearch.json "$STUDY"/optuna.db "$OUT/study/" 2>/dev/null
    tail -3 "$OUT/study.log"; cat "$OUT/all.txt"
fi
