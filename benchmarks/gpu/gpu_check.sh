#!/usr/bin/env bash
# The GPU test run the lead makes on the H200 (see shared/device/README.md).
#
#   run(command="bash benchmarks/gpu/gpu_check.sh", carry=[".gpu"])
#
# Unpacks .gpu/site.tar.xz (Transformer Engine 2.20.2, torchao 0.16.0, the
# project's other dependencies) into /tmp/site unless that is done already,
# puts it and the source tree on PYTHONPATH, and runs every test marked `gpu`
# under tests/backends. The log goes to $OUT/gpu_tests.log (and a JUnit XML
# beside it) so it comes back from the device. Extra arguments go to pytest,
# e.g. `bash benchmarks/gpu/gpu_check.sh -k te_` or `-x`.
set -uo pipefail

DEFAULT_OUT=/tmp/gpu_check_out
source "$(dirname "$0")/gpu_env.sh"

LOG="$OUT/gpu_tests.log"
{
    echo "== $(date -u +%FT%TZ) precsearch GPU check"
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1
    python3 - <<'EOF' 2>&1
import importlib
import torch
print(f"torch {torch.__version__} cuda {torch.version.cuda} gpu {torch.cuda.is_available()}")
for name in ("transformer_engine", "torchao"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as exc:  # report, the tests say what they skip
        print(f"{name} not importable: {type(exc).__name__}: {exc}")
EOF
} | tee "$LOG"

python3 -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" tests/backends "$@" 2>&1 \
    | tee -a "$LOG"
status=${PIPESTATUS[0]}
echo "== pytest exit status $status" | tee -a "$LOG"
exit "$status"
