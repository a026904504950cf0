#!/usr/bin/env bash
# Issue 29 on one H200, the TE model kept between probes and the reading's states placed by `keep_states: auto`:
#   STAGE=tests   the GPU tests of the kept TE model (tests/backends/test_gpu_te_reuse.py), of the fixed-state
#                 reading on TE (test_gpu_damage.py) and of PinnedBlock; scripts/bench_pinned.py (host states, three
#                 ways); with TRIALS=N a N-trial study of SPACE;
#   STAGE=compare scripts/bench_probe.py --compare --before-code .before: the 16-trial study of SPACE (default the
#                 shipped 8B space) with the code before these changes (BEFORE: .before/precsearch, a copy of the
#                 package at the commit before; both with the defaults) and this checkout's (AFTER), back to back.
# Carry .gpu (the bundle) and, for compare, .before:
#   run(command="STAGE=tests bash scripts/gpu_reuse_throughput.sh", carry=[".gpu"], timeout_s=600)
# The AFTER study's MLflow store says where each reading's states were kept (damage.json's states_on).
#   run(command="STAGE=compare bash scripts/gpu_reuse_throughput.sh", carry=[".gpu", ".before"], timeout_s=600)
#   run(command="STAGE=all bash scripts/gpu_reuse_throughput.sh", carry=[".gpu", ".before"], timeout_s=600)
# Make .before here first: git worktree add --detach /tmp/before COMMIT && cp -r /tmp/before/precsearch .before/
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_reuse_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SPACE="${SPACE:-search_spaces/llama3_8b_h100.yaml}"
case "${STAGE:-tests}" in
  all)  # one call for both, when the session's device time allows only one: the reuse tests, then an 8-trial compare
    timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -q -p no:cacheprovider -s tests/backends/test_gpu_te_reuse.py \
        tests/utils/test_gpu_pinned.py > "$OUT/gpu_tests_reuse.log" 2>&1
    echo "pytest exit $?" >> "$OUT/gpu_tests_reuse.log"
    grep -E "passed|failed|error|FAILED|^E |kept-fresh" "$OUT/gpu_tests_reuse.log" | tail -30
    STAGE=compare TRIALS="${TRIALS:-8}" COMPARE_TIMEOUT="${COMPARE_TIMEOUT:-390}" NAME="${NAME:-compare8}" \
        bash "$0"
    ;;
  tests)
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -s tests/backends/test_gpu_te_reuse.py \
        tests/backends/test_gpu_damage.py tests/utils/test_gpu_pinned.py > "$OUT/gpu_tests_reuse.log" 2>&1
    echo "pytest exit $?" >> "$OUT/gpu_tests_reuse.log"
    grep -E "passed|failed|error|FAILED|^E |kept-fresh" "$OUT/gpu_tests_reuse.log" | tail -40
    timeout 200 python3 scripts/bench_pinned.py --json "$OUT/bench_pinned.json" 2>&1 | tee "$OUT/bench_pinned.log"
    if [ "${TRIALS:-0}" -gt 0 ]; then
      timeout "${STUDY_TIMEOUT:-200}" python3 -m precsearch run "$SPACE" --n-trials "$TRIALS" \
          --output-dir /tmp/reuse_study --no-progress > "$OUT/study_reuse.log" 2>&1
      echo "study exit $?" >> "$OUT/study_reuse.log"
      grep -vE "RuntimeWarning|warnings.warn" "$OUT/study_reuse.log" | tail -25
    fi
    ;;
  compare)
    [ -f .before/precsearch/__init__.py ] || { echo "carry .before (the package before the change)" >&2; exit 2; }
    timeout "${COMPARE_TIMEOUT:-560}" python3 scripts/bench_probe.py "$SPACE" --trials "${TRIALS:-16}" --compare \
        --before-code .before --workdir /tmp/bench_reuse --json "$OUT/bench_probe_${NAME:-compare}.json" \
        > "$OUT/bench_probe_${NAME:-compare}.log" 2>&1
    echo "bench_probe exit $?" >> "$OUT/bench_probe_${NAME:-compare}.log"
    tail -45 "$OUT/bench_probe_${NAME:-compare}.log"
    grep -rho '"states_on": "[a-z]*"' /tmp/bench_reuse/after/study/mlartifacts 2>/dev/null | sort | uniq -c
    ;;
esac
