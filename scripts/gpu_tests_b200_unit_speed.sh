#!/usr/bin/env bash
# One H200 call after a round of merges: the GPU tests, the emulated B200 study (issue 19) and the measured
# per-unit GEMM times of the per-module space (issue 17), each under its own time cap so the call ends
# inside the device's 600 s limit. TESTS=... passes pytest arguments (e.g. a file); SPEED=0 skips the timing. Outputs are packed so at most 8 files come back.
#   run(command="bash scripts/gpu_tests_b200_unit_speed.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_tests_b200_unit_speed_out
source "$(dirname "$0")/gpu_env.sh"
t0=$(date +%s)
OUT="$OUT/tests" timeout "${TEST_TIMEOUT:-280}" bash scripts/gpu_check.sh ${TESTS:-} 2>&1 | tail -15
echo "== gpu tests done after $(( $(date +%s) - t0 )) s"
OUT="$OUT/b200" STUDY_TIMEOUT="${B200_TIMEOUT:-170}" bash scripts/gpu_b200_emulated.sh 2>&1 | tail -40
echo "== b200 study done after $(( $(date +%s) - t0 )) s"
[ "${SPEED:-1}" = 1 ] && timeout "${SPEED_TIMEOUT:-90}" python3 scripts/gpu_unit_speed.py search_spaces/llama3_8b_h200_per_module.yaml \
    "$OUT/unit_speed.json" > "$OUT/unit_speed.txt" 2>&1
echo "unit speed exit $?" >> "$OUT/unit_speed.txt"
tail -12 "$OUT/unit_speed.txt"
echo "== all done after $(( $(date +%s) - t0 )) s"
rm -f "$OUT/tests/gpu_tests.xml"
(cd "$OUT" && tar czf b200.tgz b200 && rm -rf b200 && mv tests/gpu_tests.log . && rmdir tests)
ls -la "$OUT"
