#!/usr/bin/env bash
# Issue 30 on one H200: the exported policies trained in Megatron-Core 0.19.2, torchao (torchtitan's
# converter) and Accelerate, each beside its framework's BF16 run and precsearch's memory model, plus the
# probe-vs-Megatron memory breakdown and the Megatron export GPU test. About 5 min; bounded at 8.
#   bash benchmarks/gpu/make_framework_bundle.sh     # here, once: .gpu/frameworks.tar.xz (megatron/core sources)
#   run(command="bash benchmarks/gpu/gpu_frameworks.sh", carry=[".gpu"], timeout_s=600)
# Knobs: BENCH_ARGS (default: the bench's small shape, --memory-breakdown), TESTS=0 skips the GPU test,
# NAME (default bench_frameworks) names the bench's JSON and log in $OUT, so one call can run several shapes.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_frameworks_out
source "$(dirname "$0")/gpu_env.sh"
gpu_frameworks_env
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
python3 - <<'PY' >> "$OUT/gpu.txt" 2>&1
import importlib.metadata as md
for n in ("torch", "transformer_engine", "torchao", "accelerate", "transformers", "torchtitan"):
    try: print(n, md.version(n))
    except md.PackageNotFoundError: print(n, "not installed")
import megatron.core.package_info as p; print("megatron_core", p.__version__)
PY
cat "$OUT/gpu.txt"
if [ "${TESTS:-1}" = "1" ]; then
  timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider -x tests/backends/test_gpu_megatron_export.py \
    > "$OUT/gpu_test_megatron_export.log" 2>&1
  echo "pytest exit $?" >> "$OUT/gpu_test_megatron_export.log"
  grep -E "passed|failed|skipped|error|^E " "$OUT/gpu_test_megatron_export.log" | tail -15
fi
NAME="${NAME:-bench_frameworks}"
timeout "${BENCH_TIMEOUT:-330}" python3 benchmarks/bench_frameworks.py ${BENCH_ARGS:---memory-breakdown --deadline 300} \
  --json "$OUT/$NAME.json" > "$OUT/$NAME.log" 2>&1
echo "bench_frameworks exit $?" >> "$OUT/$NAME.log"
tail -45 "$OUT/$NAME.log"
